//! The server's "now", injectable so that `creationTimestamp`, `deletionTimestamp` and `managedFields` times
//! are deterministic in tests.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;

/// Where the server reads the time of day from.
pub trait Clock: Send + Sync + Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The machine's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to; clones share the same time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let by = jiff::SignedDuration::try_from(by).unwrap_or(jiff::SignedDuration::MAX);
        *now = now.checked_add(by).unwrap_or(Timestamp::MAX);
    }

    /// Sets the clock.
    pub fn set(&self, to: Timestamp) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = to;
    }
}

impl Default for ManualClock {
    /// Stopped at 2025-01-01T00:00:00Z.
    fn default() -> Self {
        Self::new(Timestamp::from_second(1_735_689_600).unwrap_or(Timestamp::UNIX_EPOCH))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `metav1.Time`: RFC 3339 in UTC with whole seconds, `2025-01-01T00:00:00Z`.
pub(crate) fn format_time(time: Timestamp) -> String {
    time.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::default();
        assert_eq!(format_time(clock.now()), "2025-01-01T00:00:00Z");
        clock.advance(Duration::from_secs(90));
        assert_eq!(format_time(clock.now()), "2025-01-01T00:01:30Z");
    }
}
