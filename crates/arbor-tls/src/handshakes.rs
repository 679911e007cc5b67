//! The connections of a listener still in their handshake (TLS, and
//! whatever a protocol asks before it knows who is connecting), shared by
//! the listeners that accept anyone's connection (NBD, replication).
//!
//! The rule: a listener gives its handshakes a bounded number of slots, and
//! when a new connection finds every slot taken, the connection that has
//! been in its handshake longest is dropped to make room
//! ([`Handshakes::slot`]). Connections that connect and stall (or are
//! slow on purpose) therefore never keep others out for longer than it
//! takes that many newer ones to arrive, and cost a bounded amount of
//! memory; a connection past its handshake is never dropped this way.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The connections in their handshake, oldest first.
#[derive(Debug, Default)]
pub struct Handshakes {
    /// Each with the token that drops it.
    line: Mutex<VecDeque<(u64, CancellationToken)>>,
    next_id: AtomicU64,
}

impl Handshakes {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A slot of `slots` for a connection just accepted. When none is free,
    /// the connection longest in its handshake is dropped to make room;
    /// then this waits for a slot (the dropped connection frees its own as
    /// its task ends; with no handshake to drop, until a connection ends).
    pub async fn slot(&self, slots: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, AcquireError> {
        if slots.available_permits() == 0 {
            self.drop_oldest();
        }
        Arc::clone(slots).acquire_owned().await
    }

    /// Puts a connection starting its handshake at the end of the line.
    pub fn enter(self: &Arc<Self>) -> Handshake {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let dropped = CancellationToken::new();
        self.lock().push_back((id, dropped.clone()));
        Handshake {
            handshakes: Arc::clone(self),
            id,
            dropped,
        }
    }

    /// Drops the connection longest in its handshake, if any.
    fn drop_oldest(&self) {
        if let Some((id, dropped)) = self.lock().pop_front() {
            tracing::debug!(
                connection = id,
                "all slots taken: dropping the oldest handshake"
            );
            dropped.cancel();
        }
    }

    /// How many connections are in their handshake.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, CancellationToken)>> {
        // The line is changed in single steps: a panic elsewhere cannot
        // leave it half-changed.
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection's place in the line, left when dropped.
#[derive(Debug)]
pub struct Handshake {
    handshakes: Arc<Handshakes>,
    id: u64,
    dropped: CancellationToken,
}

impl Handshake {
    /// Completes when a newer connection has taken this one's place: the
    /// handshake must then be abandoned (its slot is wanted).
    pub async fn dropped(&self) {
        self.dropped.cancelled().await;
    }

    /// Leaves the line: the handshake is over. Call it before the peer can
    /// learn that, so a newcomer never drops a connection past its
    /// handshake. Leaving again does nothing.
    pub fn leave(&self) {
        self.handshakes.lock().retain(|(id, _)| *id != self.id);
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_handshake_makes_room_and_sessions_are_never_dropped() {
        let handshakes = Handshakes::new();
        let slots = Arc::new(Semaphore::new(2));
        let first = (handshakes.enter(), handshakes.slot(&slots).await.unwrap());
        let second = (handshakes.enter(), handshakes.slot(&slots).await.unwrap());
        // The first finishes its handshake: a session now, out of the line.
        first.0.leave();
        let third = handshakes.enter();
        let slot = handshakes.slot(&slots);
        tokio::pin!(slot);
        // No slot free: the second, the oldest handshake, is dropped...
        assert!(futures_poll(slot.as_mut()).is_none());
        tokio::time::timeout(std::time::Duration::from_secs(10), second.0.dropped())
            .await
            .expect("the oldest handshake is dropped");
        // ...and its slot, once freed, goes to the newcomer.
        drop(second);
        let third_slot = slot.await.unwrap();
        assert_eq!(handshakes.len(), 1);
        // The session was not dropped.
        {
            let dropped = first.0.dropped();
            tokio::pin!(dropped);
            assert!(futures_poll(dropped).is_none());
        }
        drop((third, third_slot, first));
        assert!(handshakes.is_empty());
    }

    /// Polls `f` once.
    fn futures_poll<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
