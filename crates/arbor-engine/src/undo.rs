//! The undo log behind `Volumes::atomic`: each piece of transaction state
//! (space maps, volume table, dirty nodes) logs how to undo its changes
//! while a savepoint is open, in one of these.

/// Changes of type `U` since the oldest open savepoint. Savepoints nest and
/// share the log; it is emptied when the last one closes.
pub(crate) struct UndoLog<U> {
    log: Vec<U>,
    open: usize,
}

/// Where a savepoint starts in its log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark(usize);

impl<U> Default for UndoLog<U> {
    fn default() -> Self {
        Self {
            log: Vec::new(),
            open: 0,
        }
    }
}

impl<U> UndoLog<U> {
    /// Opens a savepoint.
    pub fn begin(&mut self) -> Mark {
        self.open += 1;
        Mark(self.log.len())
    }

    /// Whether changes are being logged (a savepoint is open).
    pub fn recording(&self) -> bool {
        self.open > 0
    }

    /// Whether no savepoint is open.
    pub fn idle(&self) -> bool {
        self.open == 0
    }

    /// Logs how to undo one change, if a savepoint is open.
    pub fn push(&mut self, undo: U) {
        if self.recording() {
            self.log.push(undo);
        }
    }

    /// Closes the savepoint at `mark`, keeping its changes.
    pub fn release(&mut self, mark: Mark) {
        debug_assert!(self.open > 0 && self.log.len() >= mark.0);
        self.close();
    }

    /// Closes the savepoint at `mark`, handing its entries to `undo`, newest first.
    pub fn rollback(&mut self, mark: Mark, mut undo: impl FnMut(U)) {
        debug_assert!(self.open > 0 && self.log.len() >= mark.0);
        while self.log.len() > mark.0 {
            if let Some(entry) = self.log.pop() {
                undo(entry);
            }
        }
        self.close();
    }

    fn close(&mut self) {
        self.open = self.open.saturating_sub(1);
        if self.open == 0 {
            self.log.clear();
        }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::UndoLog;

    #[test]
    fn nested_rollback_undoes_only_its_own_newest_first() {
        let mut log = UndoLog::default();
        log.push(0); // not recording
        let outer = log.begin();
        log.push(1);
        let inner = log.begin();
        log.push(2);
        log.push(3);
        let mut undone = Vec::new();
        log.rollback(inner, |u| undone.push(u));
        assert_eq!(undone, [3, 2]);
        log.release(outer);
        assert!(log.idle() && log.is_empty());
    }
}
