//! The scrub (docs/CLI.md, `arbor scrub`): every live data block read once
//! and verified against its checksum (`Pool::scrub` and `Pool::scrub_step`,
//! a chunk shared by any number of snapshots is read once), then every
//! metadata block (`Pool::check`). It runs in the background: at full
//! speed while the pool serves no I/O (steps back to back, the next one's
//! reads queued while this one's are in flight), at `scrub_busy_rate`
//! while it does (one short step at a time), so a client's latency is not
//! taken. Where it stands is kept in the pool (the property
//! `arbor.scrub`, written every few seconds), so a restart or a crash goes
//! on from there; damage it finds is recorded as a read's is. The loop,
//! a user's start and stop and the end of a scrub all write that record:
//! each change of it is numbered (`State::version`), the writes go one at
//! a time, and one older than what the pool holds is dropped, so the pool
//! ends with the newest.
//!
//! The pool's scrub schedule (docs/MONITOR.md, "Scrub schedule") starts
//! scrubs too: while none runs, the loop looks at it once a monitor tick
//! and starts a new scrub when `arbor_monitor::scrub::turn` says one is
//! due (the decision is there; this carries it out).
//!
//! A scrub that stops on an error (a step or the metadata check at its end
//! failed, a scheduled one could not start, or its record in the pool is
//! damaged) is a failure: the monitor raises the `scrub_failed` alert
//! (docs/MONITOR.md §5) and keeps it until a scrub runs to completion,
//! whatever started it; starting or stopping one does not clear it. Why it
//! failed is kept in memory (the record has no room for it); the record
//! of a scrub that failed still says running, so a restart goes on with
//! it and either finishes it or fails again. Errors that stop the pool
//! stop the daemon instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arbor_api::model::ScrubView;
use arbor_engine::Pool;
use arbor_format::{ScrubPhase, ScrubRecord, SCRUB_KEY};
use arbor_monitor::engine as store;
use arbor_monitor::{scrub as schedule, Schedule};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::alerts::{self, Condition};
use crate::clock::{unix_now, TICK};

/// Bytes of live data one step reads (one blocking call).
const STEP_BYTES: u64 = 32 << 20;
/// A step's bytes while clients read or write: short reads, spread over
/// each second (`scrub_busy_rate` 32 MiB/s is 512 of them), so that a
/// foreground request that meets one waits for 64 KiB of the device's
/// time, not more (PERFORMANCE.md §14: with 1 MiB steps the p99 of 4 KiB
/// reads at QD1 rose to a median of 2.70x, with 64 KiB 0.47-0.88x).
const BUSY_STEP_BYTES: u64 = 64 << 10;
/// How often the record is written while a scrub runs: what a crash makes
/// it read again.
const SAVE_EVERY: Duration = Duration::from_secs(5);
/// How the rate is smoothed: the weight of the newest step.
const RATE_WEIGHT: f64 = 0.2;

/// The last step a blocking run of the scrub told of.
#[derive(Debug, Clone, Copy)]
struct Told {
    step: arbor_engine::ScrubStep,
    /// How long it took.
    took: Duration,
    /// The record after it and its version; None: the scrub was stopped
    /// or started again meanwhile.
    record: Option<(ScrubRecord, u64)>,
}

/// The scrub's pace across its steps.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// When the record was last written.
    saved: Instant,
    /// The pool's request count after the last step.
    requests: u64,
    /// Whether the pool served I/O during the last step.
    busy: bool,
}

struct State {
    record: Option<ScrubRecord>,
    /// Bytes per second, smoothed, while running.
    rate: f64,
    last_error: Option<String>,
    /// Why the last scrub stopped on an error: set by a failure, cleared
    /// only when a scrub runs to completion (the `scrub_failed` alert).
    failure: Option<String>,
    /// The pool's scrub schedule as stored (kept here as it is written:
    /// the daemon alone changes the pool), or why its value is damaged.
    schedule: Option<Result<Schedule, String>>,
    /// Changes of `record` or `failure` (what the pool's record holds),
    /// counted: a write of an older version never replaces a newer one.
    version: u64,
}

impl State {
    /// `record` or `failure` changed: the version to write it with.
    fn changed(&mut self) -> u64 {
        self.version += 1;
        self.version
    }
}

/// The daemon's scrub: its state and the task that runs it.
pub struct Scrub {
    pool: Arc<Pool>,
    state: Mutex<State>,
    wake: Notify,
    /// Bytes per second while the pool serves reads or writes; 0: wait
    /// until it serves none. A reload changes it.
    busy_rate: AtomicU64,
    /// One change of the schedule at a time (the pool, then `state`).
    schedule_change: Mutex<()>,
    /// The version of the record last written to the pool: the record is
    /// written by one writer at a time (this, then `state`), and only
    /// when newer than what the pool holds.
    written: Mutex<u64>,
}

impl Scrub {
    /// The scrub as the pool last recorded it (one that was running goes
    /// on when [`Scrub::run`] starts).
    pub fn load(pool: Arc<Pool>, busy_rate: u64) -> Self {
        let mut failure = None;
        let record = match pool.property(None, SCRUB_KEY) {
            Ok(Some(bytes)) => match ScrubRecord::decode(&bytes) {
                Ok((r, recorded_failure)) => {
                    if let Some(why) = &recorded_failure {
                        warn!(failure = %why, "the last scrub failed (recorded in the pool): it is a failure until a scrub runs to completion");
                    }
                    failure = recorded_failure;
                    Some(r)
                }
                Err(e) => {
                    warn!(error = %e, "the pool's scrub record is damaged: no scrub to go on with");
                    failure = Some(format!(
                        "the pool's scrub record is damaged ({e}): a scrub it held cannot go on"
                    ));
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                warn!(error = %e, "cannot read the pool's scrub record");
                failure = Some(format!(
                    "cannot read the pool's scrub record ({e}): a scrub it held cannot go on"
                ));
                None
            }
        };
        let schedule = match store::scrub_schedule(&pool) {
            Ok(found) => found.map(|s| s.map_err(|e| e.to_string())),
            Err(e) => Some(Err(format!("cannot read it: {e}"))),
        };
        if let Some(Err(why)) = &schedule {
            warn!(error = %why, "the pool's scrub schedule is damaged: no scrub is scheduled (arbor scrub schedule sets it again)");
        }
        Self {
            pool,
            state: Mutex::new(State {
                record,
                rate: 0.0,
                last_error: failure.clone(),
                failure,
                schedule,
                version: 0,
            }),
            wake: Notify::new(),
            busy_rate: AtomicU64::new(busy_rate),
            schedule_change: Mutex::new(()),
            written: Mutex::new(0),
        }
    }

    /// Sets the pace while the pool is busy (a reload), from the next step.
    pub fn set_busy_rate(&self, rate: u64) {
        self.busy_rate.store(rate, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a scrub, or goes on with a stopped one; one running is left
    /// running. Recorded in the pool, durably, before it returns.
    pub fn start(&self) -> arbor_engine::Result<ScrubView> {
        self.begin(true)?;
        Ok(self.view())
    }

    /// Starts a scrub unless one runs (`resume`: a stopped one goes on
    /// from where it stopped; else a new one starts from the beginning).
    /// Whether it started one; recorded in the pool before it returns.
    fn begin(&self, resume: bool) -> arbor_engine::Result<bool> {
        let (record, before, version) = {
            let mut state = self.lock();
            let before = (state.record, state.last_error.clone());
            let record = match state.record {
                Some(r) if r.phase == ScrubPhase::Running => return Ok(false),
                Some(r) if resume && r.phase == ScrubPhase::Stopped => ScrubRecord {
                    phase: ScrubPhase::Running,
                    ..r
                },
                _ => ScrubRecord {
                    phase: ScrubPhase::Running,
                    started_unix: unix_now(),
                    finished_unix: 0,
                    cursor: 0,
                    data_chunks: self.pool.pool_stats()?.data_bytes / self.pool.chunk_size(),
                    bytes: 0,
                    verified_blocks: 0,
                    damaged_blocks: 0,
                    sums_added: 0,
                    // The last completed check's finding stands (and its
                    // alert) until this one's check completes.
                    metadata_problems: state.record.and_then(|r| r.metadata_problems),
                },
            };
            state.record = Some(record);
            state.last_error = None;
            (record, before, state.changed())
        };
        // Durable before it returns: a crash right after still finds it
        // running, and the next start goes on with it.
        let durable = self
            .write(&record, version)
            .and_then(|()| self.pool.flush());
        if let Err(e) = durable {
            // Not started: as it was (unless stopped or started meanwhile).
            let mut state = self.lock();
            let ours = |r: ScrubRecord| (r.phase, r.started_unix);
            if state.record.map(ours) == Some(ours(record)) {
                (state.record, state.last_error) = before;
            }
            return Err(e);
        }
        info!(from_chunk = record.cursor, "scrub started");
        self.wake.notify_one();
        Ok(true)
    }

    /// Stops a running scrub where it is (`start` goes on from there). A
    /// scrub that stopped on an error is recorded as stopped by the user
    /// (a restart does not go on with it); its failure stays.
    pub fn stop(&self) -> arbor_engine::Result<ScrubView> {
        let (record, version) = {
            let mut state = self.lock();
            let failed = state.failure.is_some();
            let record = match state.record.as_mut() {
                Some(r) if r.phase == ScrubPhase::Running => {
                    r.phase = ScrubPhase::Stopped;
                    *r
                }
                Some(r) if r.phase == ScrubPhase::Stopped && failed => *r,
                _ => return Ok(self.view_of(&state)),
            };
            (record, state.changed())
        };
        self.write(&record, version)?;
        info!(at_chunk = record.cursor, "scrub stopped");
        Ok(self.view())
    }

    /// Sets the pool's scrub schedule to `spec` (the monitor's grammar).
    pub fn set_schedule(&self, spec: &str) -> arbor_engine::Result<ScrubView> {
        let parsed: Schedule = spec.parse().map_err(|e: arbor_monitor::PolicyError| {
            arbor_engine::Error::invalid_request(e.to_string())
        })?;
        let _one = self
            .schedule_change
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        store::store_scrub_schedule(&self.pool, &parsed)?;
        self.lock().schedule = Some(Ok(parsed));
        info!(schedule = %parsed, "scrub schedule set");
        self.wake.notify_one();
        Ok(self.view())
    }

    /// Removes the pool's scrub schedule (a running scrub goes on).
    pub fn clear_schedule(&self) -> arbor_engine::Result<ScrubView> {
        let _one = self
            .schedule_change
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if store::remove_scrub_schedule(&self.pool)? {
            info!("scrub schedule cleared");
        }
        self.lock().schedule = None;
        Ok(self.view())
    }

    /// What the schedule says at `now` (none set or damaged: nothing).
    fn turn(state: &State, now: u64) -> Option<schedule::Turn> {
        let Some(Ok(s)) = &state.schedule else {
            return None;
        };
        let running = state.record.is_some_and(|r| r.phase == ScrubPhase::Running);
        let last_started = state.record.map(|r| r.started_unix);
        Some(schedule::turn(s, last_started, running, now))
    }

    /// Starts a new scrub if the schedule says one is due at `now`;
    /// whether it started one. One that cannot start is logged (once for
    /// the same reason) and tried again at the next tick.
    fn start_if_due(&self, now: u64) -> arbor_engine::Result<bool> {
        let due = Self::turn(&self.lock(), now).is_some_and(|t| t.start);
        if !due {
            return Ok(false);
        }
        match self.begin(false) {
            Ok(started) => {
                if started {
                    info!("scheduled scrub started");
                }
                Ok(started)
            }
            Err(e) if e.stops_pool() => Err(e),
            Err(e) => {
                // Recorded with the last scrub's record, if it has one
                // (once for the same reason: this is tried every tick).
                if self.failed(format!("the scheduled scrub cannot start: {e}")) {
                    let (record, version) = {
                        let state = self.lock();
                        (state.record, state.version)
                    };
                    if let Some(r) = record {
                        self.save(&r, version);
                    }
                }
                Ok(false)
            }
        }
    }

    /// Records a failure (logged once for the same reason): the scrub's
    /// last error, and the `scrub_failed` alert until a scrub runs to
    /// completion.
    /// Whether the reason is new.
    fn failed(&self, why: String) -> bool {
        let mut state = self.lock();
        let new = state.failure.as_deref() != Some(why.as_str());
        if new {
            warn!("{why}");
        }
        state.last_error = Some(why.clone());
        state.failure = Some(why);
        state.changed();
        new
    }

    /// What the alerts say of the scrub now: why it stopped on an error,
    /// why its schedule is damaged, and the metadata problems the last
    /// completed scrub found (docs/MONITOR.md §5).
    pub fn conditions(&self) -> Vec<Condition> {
        let state = self.lock();
        let schedule = state.schedule.as_ref().and_then(|s| s.as_ref().err());
        state
            .failure
            .as_deref()
            .map(alerts::scrub_failed)
            .into_iter()
            .chain(schedule.map(|why| alerts::scrub_schedule_damaged(why)))
            .chain(
                state
                    .record
                    .and_then(|r| r.metadata_problems)
                    .filter(|&n| n > 0)
                    .map(alerts::scrub_metadata_problems),
            )
            .collect()
    }

    pub fn view(&self) -> ScrubView {
        self.view_of(&self.lock())
    }

    fn view_of(&self, state: &State) -> ScrubView {
        let scheduled = ScrubView {
            schedule: state
                .schedule
                .as_ref()
                .and_then(|s| s.as_ref().ok())
                .map(ToString::to_string),
            schedule_error: state.schedule.as_ref().and_then(|s| s.clone().err()),
            next_run: Self::turn(state, unix_now()).and_then(|t| t.next_run),
            // With no scrub recorded too: why its record could not be read.
            last_error: state.last_error.clone(),
            new_home_bytes_unsummed: self
                .pool
                .home_sums_pending()
                .saturating_mul(self.pool.chunk_size()),
            ..ScrubView::default()
        };
        let Some(r) = state.record else {
            return ScrubView {
                state: "none".to_owned(),
                ..scheduled
            };
        };
        let running = r.phase == ScrubPhase::Running;
        let live = self.pool.pool_stats().map_or(0, |s| s.data_used_bytes);
        let progress = match r.phase {
            ScrubPhase::Finished => 1.0,
            _ if r.data_chunks == 0 => 0.0,
            _ => (r.cursor as f64 / r.data_chunks as f64).min(1.0),
        };
        let rate = if running { state.rate } else { 0.0 };
        // What is left, roughly: the live data not read yet.
        let left = live.saturating_sub(r.bytes);
        ScrubView {
            state: match r.phase {
                ScrubPhase::Running => "running",
                ScrubPhase::Stopped => "stopped",
                ScrubPhase::Finished => "finished",
            }
            .to_owned(),
            started_unix_secs: r.started_unix,
            finished_unix_secs: (r.finished_unix > 0).then_some(r.finished_unix),
            progress,
            bytes_read: r.bytes,
            live_bytes: live,
            verified_blocks: r.verified_blocks,
            damaged_blocks: r.damaged_blocks,
            sums_added: r.sums_added,
            rate_bytes_per_sec: rate as u64,
            eta_secs: (running && rate >= 1.0).then(|| (left as f64 / rate) as u64),
            // This scrub's check: none until it completes.
            metadata_problems: r
                .metadata_problems
                .filter(|_| r.phase == ScrubPhase::Finished)
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            ..scheduled
        }
    }

    /// The record's bytes, with why the last scrub failed (the state's
    /// failure; the caller holds no lock).
    fn encode(&self, record: &ScrubRecord) -> Vec<u8> {
        record.encode(self.lock().failure.as_deref())
    }

    /// Writes `record`, of `version`, to the pool, unless the pool holds
    /// a newer one already (writers that race each other, the loop saving
    /// where the scrub stands and a user stopping it, leave the newest).
    fn write(&self, record: &ScrubRecord, version: u64) -> arbor_engine::Result<()> {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if *written >= version {
            return Ok(());
        }
        self.pool
            .set_property(None, SCRUB_KEY, &self.encode(record))?;
        *written = version;
        Ok(())
    }

    /// [`Scrub::write`], for the loop: a failure is logged.
    fn save(&self, record: &ScrubRecord, version: u64) {
        if let Err(e) = self.write(record, version) {
            warn!(error = %e, "cannot record where the scrub stands (a restart reads from the last record)");
        }
    }

    /// The running scrub's record, if there is one.
    fn running(&self) -> Option<ScrubRecord> {
        self.current().map(|(r, _)| r)
    }

    /// The running scrub's record and its version, if there is one.
    fn current(&self) -> Option<(ScrubRecord, u64)> {
        let state = self.lock();
        state
            .record
            .filter(|r| r.phase == ScrubPhase::Running)
            .map(|r| (r, state.version))
    }

    /// Runs scrubs as they are started, by hand or by the schedule, until
    /// the daemon stops.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Result<()> {
        loop {
            if self.running().is_none() && self.pool.home_sums_pending() > 0 {
                if !self.sum_new_homes(&stop).await? {
                    return Ok(());
                }
                continue;
            }
            if self.running().is_none() {
                let scrub = Arc::clone(&self);
                let started = tokio::task::spawn_blocking(move || scrub.start_if_due(unix_now()))
                    .await
                    .context("scrub schedule task failed")?;
                if started.context("the scheduled scrub")? {
                    continue;
                }
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = self.wake.notified() => continue,
                    _ = tokio::time::sleep(TICK) => continue,
                }
            }
            if !self.run_one(&stop).await? {
                return Ok(());
            }
        }
    }

    /// Runs the scrub until it finishes or is stopped; false when the
    /// daemon stops. While the pool serves no I/O, steps follow each other
    /// with no pause (`Pool::scrub`: the next step's reads are queued
    /// while this one's are in flight); once it does, one short step at a
    /// time, paced to `busy_rate`, until it is idle again.
    async fn run_one(self: &Arc<Self>, stop: &CancellationToken) -> Result<bool> {
        let mut pace = Pace {
            saved: Instant::now(),
            requests: self.pool.requests(),
            busy: false,
        };
        loop {
            let Some((record, version)) = self.current() else {
                return Ok(true);
            };
            if stop.is_cancelled() {
                self.save(&record, version);
                return Ok(false);
            }
            let scrub = Arc::clone(self);
            let stop_now = stop.clone();
            let cursor = record.cursor;
            let ran = tokio::task::spawn_blocking(move || scrub.steps(cursor, pace, &stop_now))
                .await
                .context("scrub task failed")?;
            let (last, ran_pace) = match ran {
                Ok(ran) => ran,
                Err(e) if e.stops_pool() => return Err(e).context("scrub"),
                Err(e) => {
                    self.stopped_on_error(format!(
                        "a scrub step failed at data chunk {cursor} of {}; stopped where it \
                         was: {e}",
                        record.data_chunks
                    ));
                    return Ok(true);
                }
            };
            pace = ran_pace;
            let Some(Told {
                step,
                took,
                record: Some((record, _)),
            }) = last
            else {
                // Stopped meanwhile: the steps' progress is kept all the same.
                return Ok(true);
            };
            if step.next >= step.data_chunks {
                self.finish(record).await?;
                return Ok(true);
            }
            // The pace while busy: `busy_rate` (a step's bytes take their
            // share of a second).
            if pace.busy {
                let pause = self.busy_pause(step.bytes, took);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::time::sleep(pause) => {}
                }
            } else {
                tokio::task::yield_now().await;
            }
        }
    }

    /// Scrubs from `cursor` (a blocking call): one short step when the pool
    /// was busy, else steps without a pause until the pool is busy, the
    /// daemon stops, the scrub is stopped or it reaches the end. The last
    /// step told of, and the pace after it.
    fn steps(
        &self,
        cursor: u64,
        mut pace: Pace,
        stop: &CancellationToken,
    ) -> arbor_engine::Result<(Option<Told>, Pace)> {
        let mut started = Instant::now();
        let mut from = cursor;
        let mut last = None;
        let mut tell = |step: &arbor_engine::ScrubStep, pace: &mut Pace| -> bool {
            let took = started.elapsed();
            started = Instant::now();
            let record = self.account(from, step, took);
            from = step.next;
            last = Some(Told {
                step: *step,
                took,
                record,
            });
            let Some((record, version)) = record else {
                return false;
            };
            if pace.saved.elapsed() >= SAVE_EVERY {
                self.save(&record, version);
                pace.saved = Instant::now();
            }
            let now = self.pool.requests();
            pace.busy = now != pace.requests;
            pace.requests = now;
            !pace.busy && !stop.is_cancelled()
        };
        if pace.busy {
            let step = self.pool.scrub_step(cursor, BUSY_STEP_BYTES)?;
            tell(&step, &mut pace);
        } else {
            self.pool
                .scrub(cursor, STEP_BYTES, |step| tell(step, &mut pace))?;
        }
        Ok((last, pace))
    }

    /// The pause after a step of `bytes` that took `took` while the pool
    /// is busy: the step's share of a second at `busy_rate`.
    fn busy_pause(&self, bytes: u64, took: Duration) -> Duration {
        let rate = self.busy_rate.load(Ordering::Relaxed);
        if rate == 0 {
            Duration::from_millis(100)
        } else {
            Duration::from_secs_f64(bytes as f64 / rate as f64).saturating_sub(took)
        }
    }

    /// Runs the pass that gives new homes their checksums
    /// (`Pool::sum_new_homes`: the blocks a home's build wrote) until none
    /// is left, a scrub runs, or the daemon stops (false), at the scrub's
    /// pace: streamed while the pool is idle, one short step at
    /// `busy_rate` while it serves I/O. A step that met a home being built
    /// waits a tick; one that fails leaves the rest to the next scrub.
    async fn sum_new_homes(self: &Arc<Self>, stop: &CancellationToken) -> Result<bool> {
        let mut pace = Pace {
            saved: Instant::now(),
            requests: self.pool.requests(),
            busy: false,
        };
        let mut added = 0;
        while self.pool.home_sums_pending() > 0 && self.running().is_none() {
            if stop.is_cancelled() {
                return Ok(false);
            }
            let scrub = Arc::clone(self);
            let stop_now = stop.clone();
            let ran = tokio::task::spawn_blocking(move || scrub.home_steps(pace, &stop_now))
                .await
                .context("new homes' checksums task failed")?;
            let (last, ran_pace) = match ran {
                Ok(ran) => ran,
                Err(e) if e.stops_pool() => return Err(e).context("new homes' checksums"),
                Err(e) => {
                    let left = self.pool.leave_home_sums_to_scrub();
                    warn!(error = %e, chunks = left, "giving new homes their checksums failed: the next scrub gives them");
                    return Ok(true);
                }
            };
            pace = ran_pace;
            let Some((step, took)) = last else {
                continue;
            };
            added += step.sums_added;
            let pause = if step.sums_deferred > 0 {
                TICK
            } else if pace.busy {
                self.busy_pause(step.bytes, took)
            } else {
                Duration::ZERO
            };
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
        if self.pool.home_sums_pending() == 0 {
            info!(sums_added = added, "new homes have their checksums");
        }
        Ok(true)
    }

    /// Steps of the pass over new homes (a blocking call), as
    /// [`Scrub::steps`] runs the scrub's: the last step and how long it
    /// took, and the pace after it.
    fn home_steps(
        &self,
        mut pace: Pace,
        stop: &CancellationToken,
    ) -> arbor_engine::Result<(Option<(arbor_engine::ScrubStep, Duration)>, Pace)> {
        let mut started = Instant::now();
        let mut last = None;
        let busy = pace.busy;
        let tell = |step: &arbor_engine::ScrubStep| -> bool {
            last = Some((*step, started.elapsed()));
            started = Instant::now();
            let now = self.pool.requests();
            pace.busy = now != pace.requests;
            pace.requests = now;
            !pace.busy && !stop.is_cancelled() && self.running().is_none()
        };
        if busy {
            self.pool.sum_new_homes(BUSY_STEP_BYTES, false, tell)?;
        } else {
            self.pool.sum_new_homes(STEP_BYTES, true, tell)?;
        }
        Ok((last, pace))
    }

    /// Adds a step from chunk `from` to the scrub's record and its rate:
    /// the record after it and its version, or None when the scrub is no
    /// longer running.
    /// A scrub stopped meanwhile keeps the step's progress (one resumed
    /// goes on after it); one that no longer stands at `from` (a new scrub
    /// started meanwhile) is left alone.
    fn account(
        &self,
        from: u64,
        step: &arbor_engine::ScrubStep,
        took: Duration,
    ) -> Option<(ScrubRecord, u64)> {
        let mut state = self.lock();
        let rate = step.bytes as f64 / took.as_secs_f64().max(1e-6);
        state.rate = if state.rate == 0.0 {
            rate
        } else {
            state.rate * (1.0 - RATE_WEIGHT) + rate * RATE_WEIGHT
        };
        if state.record.is_none_or(|r| r.cursor != from) {
            return None;
        }
        let r = state.record.as_mut()?;
        r.sums_added += step.sums_added;
        r.cursor = step.next;
        r.data_chunks = step.data_chunks;
        r.bytes += step.bytes;
        r.verified_blocks += step.verified_blocks;
        r.damaged_blocks += step.damaged_blocks;
        let record = *r;
        let version = state.changed();
        (record.phase == ScrubPhase::Running).then_some((record, version))
    }

    /// The running scrub stopped on an error (`why`): stopped here, a
    /// failure until a scrub runs to completion. Its record in the pool
    /// keeps its progress and still says running (state 2 is "stopped by
    /// a user"), so a restart goes on with it. One a user stopped
    /// meanwhile stays as they left it.
    fn stopped_on_error(&self, why: String) {
        self.failed(why);
        let record = {
            let mut state = self.lock();
            match state.record.as_mut() {
                Some(r) if r.phase == ScrubPhase::Running => {
                    let recorded = *r;
                    r.phase = ScrubPhase::Stopped;
                    Some((recorded, state.changed()))
                }
                _ => None,
            }
        };
        if let Some((r, version)) = record {
            self.save(&r, version);
        }
    }

    /// The data is done: every metadata block next (a full check), then
    /// the scrub is finished; a check that fails stops it on an error.
    async fn finish(&self, mut record: ScrubRecord) -> Result<()> {
        let pool = Arc::clone(&self.pool);
        let checked = tokio::task::spawn_blocking(move || pool.check())
            .await
            .context("scrub check task failed")?;
        let problems = match checked {
            Ok(report) => report.problems.len() + report.unlisted,
            Err(e) if e.stops_pool() => return Err(e).context("scrub's metadata check"),
            Err(e) => {
                self.stopped_on_error(format!("the scrub's metadata check failed: {e}"));
                return Ok(());
            }
        };
        record.phase = ScrubPhase::Finished;
        record.finished_unix = unix_now();
        let version = {
            let mut state = self.lock();
            // Stopped or started again meanwhile: leave it.
            if state.record.map(|r| r.phase) != Some(ScrubPhase::Running) {
                return Ok(());
            }
            record.metadata_problems = Some(problems as u64);
            state.record = Some(record);
            // Run to completion: what clears a failure.
            if let Some(why) = state.failure.take() {
                info!(failure = %why, "the scrub ran to completion: its earlier failure is cleared");
            }
            state.changed()
        };
        self.save(&record, version);
        info!(
            bytes = record.bytes,
            verified_blocks = record.verified_blocks,
            damaged_blocks = record.damaged_blocks,
            sums_added = record.sums_added,
            metadata_problems = problems,
            "scrub finished"
        );
        if record.damaged_blocks > 0 || problems > 0 {
            warn!("the scrub found damage: arbor pool damage and arbor check list it");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    use arbor_api::model::{AlertKind, Severity};
    use arbor_engine::{CreateOptions, DeviceIdentity, OpenOptions};
    use arbor_io::{BlockDevice, SimDisk};

    const MIB: u64 = 1 << 20;

    /// An origin's device whose flushes fail while `failing` is set, as a
    /// disk that drops out does; everything else is the simulated disk's.
    struct DroppingOut {
        disk: SimDisk,
        failing: AtomicBool,
    }

    impl BlockDevice for DroppingOut {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.disk.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.disk.write_at(buf, offset)
        }
        fn flush(&self) -> std::io::Result<()> {
            if self.failing.load(Ordering::Acquire) {
                return Err(std::io::Error::other("the disk dropped out"));
            }
            self.disk.flush()
        }
        fn size(&self) -> u64 {
            self.disk.size()
        }
    }

    /// A 64 MiB pool on a simulated disk.
    fn sim_pool() -> Arc<Pool> {
        let disk: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(64 * MIB));
        let opts = CreateOptions {
            chunk_size: 4096,
            metadata_bytes: Some(4 * MIB),
            ..Default::default()
        };
        Arc::new(Pool::create(disk, &opts, &OpenOptions::default()).unwrap())
    }

    /// Runs the scrub's loop until its view satisfies `done` (within a
    /// minute), then stops the loop.
    async fn run_until(scrub: &Arc<Scrub>, done: impl Fn(&ScrubView) -> bool) -> ScrubView {
        let stop = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(scrub).run(stop.clone()));
        let deadline = Instant::now() + Duration::from_secs(60);
        let view = loop {
            let view = scrub.view();
            if done(&view) {
                break view;
            }
            assert!(
                Instant::now() < deadline,
                "the scrub never got there: {view:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        stop.cancel();
        task.await.unwrap().unwrap();
        view
    }

    fn failure(scrub: &Scrub) -> Option<String> {
        let found = scrub.conditions();
        assert!(found.len() <= 1, "{found:?}");
        found.into_iter().next().map(|c| {
            assert_eq!(
                (c.kind, c.severity),
                (AlertKind::ScrubFailed, Severity::Critical)
            );
            c.message
        })
    }

    fn recorded(pool: &Pool) -> ScrubRecord {
        ScrubRecord::decode(&pool.property(None, SCRUB_KEY).unwrap().unwrap())
            .unwrap()
            .0
    }

    /// A pool upgraded from version 9: the scrub gives every block of its
    /// live data a checksum and says how many; the next scrub gives none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrub_of_an_upgraded_pool_says_how_many_blocks_it_gave_a_checksum() {
        let disk: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(64 * MIB));
        let opts = CreateOptions {
            chunk_size: 4096,
            metadata_bytes: Some(4 * MIB),
            format_version: arbor_format::FormatVersion::new(9).unwrap(),
            ..Default::default()
        };
        let pool = Arc::new(Pool::create(disk, &opts, &OpenOptions::default()).unwrap());
        let v = pool.create_volume("v", 4 * MIB).unwrap();
        pool.write(v, 0, &[7u8; 65536]).unwrap();
        pool.flush().unwrap();
        assert!(pool.upgrade().unwrap());
        let scrub = Arc::new(Scrub::load(Arc::clone(&pool), 0));
        scrub.start().unwrap();
        let view = run_until(&scrub, |v| v.state == "finished").await;
        // The volume's 16 blocks; the scrub's own record (a property
        // written since the upgrade) had one already.
        assert_eq!(view.sums_added, 16, "{view:?}");
        assert_eq!(
            view.verified_blocks + 16,
            view.bytes_read / 4096,
            "{view:?}"
        );
        // Kept in the pool's record.
        assert_eq!(
            Scrub::load(Arc::clone(&pool), 0).view().sums_added,
            16,
            "after a restart"
        );
        scrub.start().unwrap();
        let view = run_until(&scrub, |v| v.state == "finished").await;
        assert_eq!(view.sums_added, 0, "{view:?}");
        assert_eq!(view.verified_blocks, view.bytes_read / 4096, "{view:?}");
    }

    /// A home built in the pool (a copy-on-write volume created here) is
    /// given its checksums by the loop while no scrub runs, shown in the
    /// view until it has them: a scrub afterwards finds none to add.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_loop_gives_a_new_home_its_checksums() {
        let pool = sim_pool();
        pool.create_cow_volume("h", 4 * MIB).unwrap();
        let scrub = Arc::new(Scrub::load(Arc::clone(&pool), 0));
        assert_eq!(scrub.view().new_home_bytes_unsummed, 4 * MIB);
        let view = run_until(&scrub, |v| v.new_home_bytes_unsummed == 0).await;
        assert_eq!(view.state, "none", "no scrub ran: {view:?}");
        assert_eq!(pool.home_sums_pending(), 0);
        scrub.start().unwrap();
        let view = run_until(&scrub, |v| v.state == "finished").await;
        assert_eq!(view.sums_added, 0, "{view:?}");
        assert_eq!(view.damaged_blocks, 0, "{view:?}");
        assert!(view.verified_blocks >= 4 * MIB / 4096, "{view:?}");
    }

    /// Starts and stops by a user while the loop runs, saves and finishes
    /// scrubs: every one succeeds, and the pool's record says what the
    /// daemon says (the same scrub, in the same phase). (Regression: a
    /// start that met the loop's save of a finished scrub failed with
    /// "property arbor.scrub was set again meanwhile", and a save of an
    /// older state could land after a newer one.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn starts_and_stops_while_the_loop_saves_all_succeed_and_the_pool_agrees() {
        let pool = sim_pool();
        let v = pool.create_volume("v", 8 * MIB).unwrap();
        pool.write(v, 0, &[7u8; 1 << 20]).unwrap();
        pool.flush().unwrap();
        let scrub = Arc::new(Scrub::load(Arc::clone(&pool), 0));
        let stop = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&scrub).run(stop.clone()));
        let user = Arc::clone(&scrub);
        let finished = tokio::task::spawn_blocking(move || {
            let mut finished = 0;
            for i in 0..500 {
                let view = user.start().unwrap_or_else(|e| panic!("start {i}: {e}"));
                finished += usize::from(view.state == "finished");
                if i % 3 != 0 {
                    user.stop().unwrap_or_else(|e| panic!("stop {i}: {e}"));
                }
                // Now and then a scrub runs to its end.
                if i % 10 == 0 {
                    while user.view().state == "running" {
                        std::thread::yield_now();
                    }
                }
            }
            finished
        })
        .await
        .unwrap();
        stop.cancel();
        task.await.unwrap().unwrap();
        assert!(finished < 500);
        let ours = scrub.lock().record.unwrap();
        let stored = recorded(&pool);
        assert_eq!(
            (stored.phase, stored.started_unix),
            (ours.phase, ours.started_unix),
            "{stored:?} against {ours:?}"
        );
        assert_eq!(failure(&scrub), None);
    }

    /// The metadata check at a scrub's end fails (it flushes the pool, and
    /// an origin's device fails its flushes): the scrub stops on the error
    /// and is a failure, which a scheduled scrub that cannot start keeps,
    /// and which clears only when a scrub runs to completion. In the pool
    /// it still runs, so a restart would go on with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_metadata_check_is_a_failure_until_a_scrub_runs_to_completion() {
        let pool = sim_pool();
        let v = pool.create_volume("v", 4 * MIB).unwrap();
        pool.write(v, 0, &[7u8; 65536]).unwrap();
        let device = Arc::new(DroppingOut {
            disk: SimDisk::new(MIB),
            failing: AtomicBool::new(false),
        });
        let origin = pool
            .attach_origin("disk", device.clone(), DeviceIdentity { dev: 7, ino: 1 })
            .unwrap();
        pool.flush().unwrap();
        let scrub = Arc::new(Scrub::load(Arc::clone(&pool), 0));
        assert_eq!(failure(&scrub), None);

        scrub.start().unwrap();
        pool.write(origin, 0, &[1u8; 4096]).unwrap();
        device.failing.store(true, Ordering::Release);
        let view = run_until(&scrub, |v| v.state != "running").await;
        assert_eq!(view.state, "stopped", "{view:?}");
        assert!(view.bytes_read > 0, "{view:?}");
        let why = failure(&scrub).expect("a failure");
        assert!(
            why.contains("metadata check failed") && why.contains("the disk dropped out"),
            "{why}"
        );
        assert_eq!(
            view.last_error.as_deref().map(|e| why.starts_with(e)),
            Some(true)
        );
        assert_eq!(recorded(&pool).phase, ScrubPhase::Running);
        // Kept in the pool's record: a restart raises it again.
        let restarted = Scrub::load(Arc::clone(&pool), 0);
        assert_eq!(failure(&restarted), Some(why.clone()));
        drop(restarted);

        // Neither a scheduled scrub nor one started by hand can start (a
        // start flushes): still a failure, and still stopped.
        scrub.set_schedule("every 1s").unwrap();
        assert!(!scrub.start_if_due(unix_now() + 10).unwrap());
        let why = failure(&scrub).expect("a failure");
        assert!(why.contains("the scheduled scrub cannot start"), "{why}");
        assert!(scrub.start().is_err());
        assert_eq!(scrub.view().state, "stopped");
        assert!(failure(&scrub).is_some());
        scrub.clear_schedule().unwrap();

        // The device works again: started by hand, the scrub goes on from
        // where it stopped and runs to completion; the failure is gone.
        device.failing.store(false, Ordering::Release);
        scrub.start().unwrap();
        assert!(failure(&scrub).is_some(), "a start alone does not clear it");
        let view = run_until(&scrub, |v| v.state != "running").await;
        assert_eq!(view.state, "finished", "{view:?}");
        assert_eq!(view.metadata_problems, Some(0), "{view:?}");
        assert_eq!(failure(&scrub), None);
        assert_eq!(recorded(&pool).phase, ScrubPhase::Finished);
    }

    /// Metadata problems the last completed scrub's check found are a
    /// critical alert, from the pool's record (so after a restart too),
    /// while the next scrub runs, until a scrub's check finds none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metadata_problems_a_scrub_found_are_an_alert_until_a_check_finds_none() {
        let pool = sim_pool();
        let v = pool.create_volume("v", 4 * MIB).unwrap();
        pool.write(v, 0, &[7u8; 65536]).unwrap();
        pool.flush().unwrap();
        let found = ScrubRecord {
            phase: ScrubPhase::Finished,
            started_unix: 1,
            finished_unix: 2,
            cursor: 10,
            data_chunks: 10,
            bytes: 4096,
            verified_blocks: 1,
            damaged_blocks: 0,
            sums_added: 0,
            metadata_problems: Some(2),
        };
        pool.set_property(None, SCRUB_KEY, &found.encode(None))
            .unwrap();
        let scrub = Arc::new(Scrub::load(Arc::clone(&pool), 0));
        let alert = |scrub: &Scrub| {
            scrub
                .conditions()
                .into_iter()
                .find(|c| c.kind == AlertKind::ScrubMetadataProblems)
                .map(|c| (c.severity, c.message))
        };
        let (severity, message) = alert(&scrub).expect("the alert");
        assert_eq!(severity, Severity::Critical);
        assert!(message.contains("2 problem"), "{message}");
        assert_eq!(scrub.view().metadata_problems, Some(2));
        // A new scrub: its own check has not run, the last one's finding
        // stands.
        scrub.start().unwrap();
        assert_eq!(scrub.view().metadata_problems, None);
        assert!(alert(&scrub).is_some(), "while the next scrub runs");
        assert_eq!(recorded(&pool).metadata_problems, Some(2));
        let view = run_until(&scrub, |v| v.state == "finished").await;
        assert_eq!(view.metadata_problems, Some(0), "{view:?}");
        assert_eq!(alert(&scrub), None);
        assert_eq!(recorded(&pool).metadata_problems, Some(0));
        assert_eq!(alert(&Scrub::load(Arc::clone(&pool), 0)), None);
    }

    /// A step counts only for the scrub that stands where it started: one
    /// that comes back after a new scrub started (a stop, then a scheduled
    /// start) is not added to it, which would move its cursor past chunks
    /// it never read; one that comes back after a stop is kept, so a
    /// resumed scrub goes on after it.
    /// A write of an older version of the record, come late, leaves the
    /// newer one the pool holds.
    #[test]
    fn an_older_record_never_replaces_a_newer_one() {
        let pool = sim_pool();
        let scrub = Scrub::load(Arc::clone(&pool), 0);
        scrub.start().unwrap();
        let (running, old) = scrub.current().unwrap();
        scrub.stop().unwrap();
        assert_eq!(recorded(&pool).phase, ScrubPhase::Stopped);
        scrub.write(&running, old).unwrap();
        assert_eq!(recorded(&pool).phase, ScrubPhase::Stopped);
        // A newer one is written.
        scrub.start().unwrap();
        assert_eq!(recorded(&pool).phase, ScrubPhase::Running);
    }

    #[test]
    fn a_step_counts_only_for_the_scrub_standing_where_it_started() {
        let pool = sim_pool();
        let scrub = Scrub::load(Arc::clone(&pool), 0);
        scrub.start().unwrap();
        let step = |from: u64| arbor_engine::ScrubStep {
            next: from + 8,
            data_chunks: 1000,
            chunks: 8,
            bytes: 8 * 4096,
            verified_blocks: 8,
            ..Default::default()
        };
        let took = Duration::from_millis(1);
        let (r, version) = scrub.account(0, &step(0), took).expect("running");
        assert_eq!((r.cursor, r.bytes), (8, 8 * 4096));
        // A change of the record: a newer version than the start's.
        assert_eq!(version, scrub.lock().version);
        assert!(version > *scrub.written.lock().unwrap());
        // Stopped meanwhile: kept, not running.
        scrub.stop().unwrap();
        assert_eq!(scrub.account(8, &step(8), took), None);
        assert_eq!(scrub.lock().record.unwrap().cursor, 16);
        // A new scrub from the start: a step of the old one (from 16) is
        // not its, and leaves it at 0.
        scrub.begin(false).unwrap();
        assert_eq!(scrub.lock().record.unwrap().cursor, 0);
        assert_eq!(scrub.account(16, &step(16), took), None);
        let r = scrub.lock().record.unwrap();
        assert_eq!((r.cursor, r.bytes, r.verified_blocks), (0, 0, 0));
        assert_eq!(scrub.account(0, &step(0), took).unwrap().0.cursor, 8);
    }

    /// A stored schedule that does not parse is a warning until it is set
    /// again or cleared; a damaged scrub record is a failure.
    #[test]
    fn a_damaged_schedule_and_a_damaged_record_are_alerts() {
        let pool = sim_pool();
        pool.set_property(None, schedule::SCRUB_SCHEDULE_KEY, b"now and then")
            .unwrap();
        pool.set_property(None, SCRUB_KEY, &[0u8; 64]).unwrap();
        let scrub = Scrub::load(Arc::clone(&pool), 0);
        let kinds = |scrub: &Scrub| -> Vec<(AlertKind, Severity)> {
            scrub
                .conditions()
                .into_iter()
                .map(|c| (c.kind, c.severity))
                .collect()
        };
        assert_eq!(
            kinds(&scrub),
            [
                (AlertKind::ScrubFailed, Severity::Critical),
                (AlertKind::ScrubScheduleDamaged, Severity::Warning)
            ]
        );
        scrub.set_schedule("daily").unwrap();
        assert_eq!(
            kinds(&scrub),
            [(AlertKind::ScrubFailed, Severity::Critical)]
        );
        pool.set_property(None, schedule::SCRUB_SCHEDULE_KEY, b"now and then")
            .unwrap();
        let scrub = Scrub::load(Arc::clone(&pool), 0);
        scrub.clear_schedule().unwrap();
        assert_eq!(
            kinds(&scrub),
            [(AlertKind::ScrubFailed, Severity::Critical)]
        );
    }
}
