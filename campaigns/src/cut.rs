//! Where to cut power in a recorded event log, shared by the campaigns that
//! replay recordings: just before and just after every flush and every
//! write made durable alone (an intent log record), and at random events;
//! at each cut, several crash images.

use std::sync::Arc;

use arbor_io::{CrashKind, CrashReplayer, IoEvent, OverlayDevice};
use rand::rngs::StdRng;
use rand::Rng;

/// One crash image to verify.
pub struct Crash {
    pub dev: Arc<OverlayDevice>,
    pub kind: CrashKind,
    /// Events replayed before the cut.
    pub event: u64,
}

pub struct Cutter {
    pub replay: CrashReplayer,
    /// Chance (percent) of a cut at an event not next to a flush.
    pub random_cut_percent: u32,
    /// Crash images per cut point with unflushed writes (at least 2: all
    /// kept and none kept; the rest random subsets with torn writes).
    pub variants: usize,
    pub cut_points: u64,
    pub images: u64,
}

impl Cutter {
    /// Starts from a zeroed device of `bytes` bytes.
    pub fn new(bytes: u64, random_cut_percent: u32, variants: usize) -> Self {
        Self {
            replay: CrashReplayer::new(vec![0; bytes as usize]),
            random_cut_percent,
            variants,
            cut_points: 0,
            images: 0,
        }
    }

    /// Replays `events` without cutting (e.g. the pool's creation).
    pub fn skip(&mut self, events: Vec<IoEvent>) -> Result<(), String> {
        for event in events {
            self.replay
                .apply(event)
                .map_err(|e| format!("replay: {e}"))?;
        }
        Ok(())
    }

    /// Replays `events`, returning the crash images of the cuts made on the way.
    pub fn feed(&mut self, events: Vec<IoEvent>, rng: &mut StdRng) -> Result<Vec<Crash>, String> {
        let mut crashes = Vec::new();
        let mut events = events.into_iter().peekable();
        let barrier = |e: &IoEvent| matches!(e, IoEvent::Flush | IoEvent::DurableWrite { .. });
        while let Some(event) = events.next() {
            let is_barrier = barrier(&event);
            self.replay
                .apply(event)
                .map_err(|e| format!("replay: {e}"))?;
            let next_is_barrier = events.peek().is_some_and(barrier);
            if is_barrier || next_is_barrier || rng.gen_range(0..100) < self.random_cut_percent {
                self.cut_here(rng, &mut crashes);
            }
        }
        Ok(crashes)
    }

    fn cut_here(&mut self, rng: &mut StdRng, crashes: &mut Vec<Crash>) {
        self.cut_points += 1;
        let kinds: Vec<CrashKind> = if self.replay.unflushed() == 0 {
            vec![CrashKind::KeepAll]
        } else {
            let mut kinds = vec![CrashKind::KeepAll, CrashKind::DropAll];
            kinds.extend((2..self.variants.max(2)).map(|_| CrashKind::Random { tear_percent: 30 }));
            kinds
        };
        for kind in kinds {
            self.images += 1;
            crashes.push(Crash {
                dev: Arc::new(self.replay.crash_device(kind, rng)),
                kind,
                event: self.replay.events(),
            });
        }
    }
}
