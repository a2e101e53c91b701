//! One error policy for the three controllers: what a failed request means for when to try again.
//!
//! - **This replica stopped leading** (a write refused by the leadership gate, or cut off when the
//!   leadership ended while it waited for its answer): nothing failed. The leader carries on; the loop counts
//!   no failure and waits for the leadership to come back.
//! - **The server asked for a wait** (429 with `Retry-After`): the next try waits at least that long.
//! - **Anything else**: back off, doubling per failure in a row from the loop's [`Backoff::base`] up to its
//!   [`Backoff::cap`], spread by up to a quarter so that keys failing together do not retry together.
//!
//! Each loop names its own [`Backoff`] (the reconciler's pass, the labeller's nodes, the upgrade
//! controller's steps); the classification is this one.

use std::time::Duration;

use crate::api_client::is_not_leader;

/// What a failed request calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// This replica no longer leads: not a failure; the leader does the rest.
    NotLeader,
    /// A failure; the server asked for at least this wait before the next try.
    AtLeast(Duration),
    /// A failure; back off.
    BackOff,
}

/// What `error` (and every error it wraps) calls for.
pub fn classify(error: &(dyn std::error::Error + 'static)) -> Retry {
    if is_not_leader(error) {
        return Retry::NotLeader;
    }
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(kube::Error::Api(status)) = error.downcast_ref::<kube::Error>()
            && status.code == 429
            && let Some(details) = &status.details
            && details.retry_after_seconds > 0
        {
            return Retry::AtLeast(Duration::from_secs(u64::from(details.retry_after_seconds)));
        }
        current = error.source();
    }
    Retry::BackOff
}

/// How a loop backs off: `base` after the first failure in a row, doubling per failure, at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub base: Duration,
    /// The longest wait.
    pub cap: Duration,
}

impl Backoff {
    /// The wait after the `failures`-th failure in a row of `key`: [`Backoff::base`] doubled per failure,
    /// up to a quarter more by a hash of the key and the count, at most [`Backoff::cap`].
    pub fn wait(&self, key: &str, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        let exact = self.base.saturating_mul(1 << doublings).min(self.cap);
        // FNV-1a: stable across runs and platforms, so a test sees the same spread every time.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in key.bytes().chain(failures.to_le_bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        let spread = exact.mul_f64((hash % 1024) as f64 / 4096.0);
        (exact + spread).min(self.cap)
    }

    /// The wait before the next try after `error`, the `failures`-th failure in a row of `key`; `None`
    /// when this replica stopped leading.
    pub fn after(
        &self,
        error: &(dyn std::error::Error + 'static),
        key: &str,
        failures: u32,
    ) -> Option<Duration> {
        match classify(error) {
            Retry::NotLeader => None,
            Retry::AtLeast(wait) => Some(self.wait(key, failures).max(wait)),
            Retry::BackOff => Some(self.wait(key, failures)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_client::TimedOut;
    use crate::lease::NotLeader;

    fn api_error(code: u16, retry_after_seconds: u32) -> kube::Error {
        let status = serde_json::json!({
            "status": "Failure",
            "code": code,
            "details": { "retryAfterSeconds": retry_after_seconds },
        });
        kube::Error::Api(serde_json::from_value(status).expect("a Status"))
    }

    /// An error wrapping another, as the reconciler's step errors wrap the API's.
    #[derive(Debug, thiserror::Error)]
    #[error("step failed")]
    struct Step(#[source] kube::Error);

    #[test]
    fn losing_the_leadership_is_not_a_failure() {
        assert_eq!(classify(&NotLeader), Retry::NotLeader);
        let cut_off = TimedOut {
            method: "PATCH".into(),
            path: "/api/v1/nodes/gpu-0".into(),
            limit: Duration::from_secs(3),
            leadership_ended: true,
        };
        assert_eq!(classify(&cut_off), Retry::NotLeader);
        let slow = TimedOut {
            leadership_ended: false,
            ..cut_off
        };
        assert_eq!(classify(&slow), Retry::BackOff);
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        assert_eq!(backoff.after(&NotLeader, "pass", 3), None);
    }

    #[test]
    fn the_servers_retry_after_is_honoured_even_when_wrapped() {
        assert_eq!(
            classify(&api_error(429, 7)),
            Retry::AtLeast(Duration::from_secs(7))
        );
        assert_eq!(
            classify(&Step(api_error(429, 7))),
            Retry::AtLeast(Duration::from_secs(7))
        );
        assert_eq!(classify(&api_error(429, 0)), Retry::BackOff, "no wait asked for");
        assert_eq!(classify(&api_error(500, 7)), Retry::BackOff);
        let backoff = Backoff {
            base: Duration::from_millis(200),
            cap: Duration::from_secs(300),
        };
        let waited = backoff.after(&api_error(429, 7), "gpu-0", 1).unwrap();
        assert_eq!(waited, Duration::from_secs(7));
        assert!(backoff.after(&api_error(500, 0), "gpu-0", 1).unwrap() < Duration::from_millis(251));
    }

    #[test]
    fn a_backoff_doubles_to_its_cap_and_spreads_keys() {
        let backoff = Backoff {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(60),
        };
        for failures in 1..=12u32 {
            let exact = (backoff.base * 2u32.pow(failures - 1)).min(backoff.cap);
            let wait = backoff.wait("pass", failures);
            assert!(
                wait >= exact && wait <= (exact + exact / 4).min(backoff.cap),
                "failure {failures}: {wait:?}"
            );
        }
        assert_eq!(backoff.wait("pass", 1000), backoff.cap);
        assert_ne!(backoff.wait("gpu-0", 3), backoff.wait("gpu-1", 3));
        let fixed = Backoff {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(2),
        };
        assert_eq!(fixed.wait("step", 1), Duration::from_secs(2));
        assert_eq!(fixed.wait("step", 9), Duration::from_secs(2));
    }
}
