//! The report step: the one writer of the statuses a pass computed, for every kind the operator reports
//! on (ClusterPolicy, NVIDIADriver, and whatever kind comes next), and of the event a change of state calls
//! for.
//!
//! One rule for every kind:
//! - **Made from the last status written.** The status is computed from the stored one until this replica
//!   writes, then from its own write while the watch may not have brought it back ([`IN_FLIGHT`]).
//!   Computed from a stale stored one, a changed condition would get a new transition time each pass and
//!   be written again each interval until the echo came.
//! - **Written when it differs**, by server-side apply of `status` alone under the operator's field
//!   manager; the answer is not decoded (an object that does not decode still gets its status).
//! - **At most once per [`STATUS_INTERVAL`].** A change within the interval of the last write is put off
//!   until it ends, so a rollout costs a write a second, not one per pass, and a node flipping between
//!   ready and not does not write as often as it flips.
//! - **An event when the state changes**, as each kind's rule in [`crate::status`] says.
//!
//! An object that does not decode has no stored status to compare with: the last status written for it is
//! trusted for as long as the process runs.

use std::sync::Mutex;
use std::time::Duration;

use gpuop_api::status::PolicyStatus;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource};
use tracing::{info, warn};

use crate::status::Transition;
use crate::unconfirmed::{IN_FLIGHT, Unconfirmed, now};

/// The least time between two status writes of one object.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The object a status goes to: what of it the status depends on, also for one that does not decode (its
/// metadata still does).
#[derive(Clone, Debug)]
pub struct StatusTarget<'a> {
    resource: ApiResource,
    name: String,
    generation: Option<i64>,
    /// The stored status; `None` when there is none or the object does not decode.
    stored: Option<&'a PolicyStatus>,
    decoded: bool,
    reference: ObjectReference,
}

impl<'a> StatusTarget<'a> {
    /// An object that decoded, carrying `stored`.
    pub fn new<K: Resource<DynamicType = ()>>(object: &K, stored: Option<&'a PolicyStatus>) -> Self {
        Self {
            stored,
            decoded: true,
            ..Self::undecoded(object)
        }
    }

    /// An object whose spec or status does not decode.
    pub fn undecoded<K: Resource<DynamicType = ()>>(object: &K) -> Self {
        Self {
            resource: ApiResource::erase::<K>(&()),
            name: object.meta().name.clone().unwrap_or_default(),
            generation: object.meta().generation,
            stored: None,
            decoded: false,
            reference: object.object_ref(&()),
        }
    }

    /// The object's `metadata.generation`, which its status observes.
    pub fn generation(&self) -> Option<i64> {
        self.generation
    }

    /// `Kind name`, for messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.resource.kind, self.name)
    }

    fn key(&self) -> (String, String) {
        (self.resource.kind.clone(), self.name.clone())
    }
}

/// A status the pass computed, and whether writing it was put off.
#[derive(Debug)]
pub struct StatusWrite {
    /// The status.
    pub status: PolicyStatus,
    /// Set when the status changed within [`STATUS_INTERVAL`] of the last write: the pass must run again
    /// after this long to write it.
    pub deferred: Option<Duration>,
}

/// What becomes of a computed status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Nothing to write: it is stored, or was just written, or this replica does not lead.
    Keep,
    /// Write it after this long.
    Defer(Duration),
    /// Write it now.
    Write,
}

/// The status a new one is made from: this replica's last write while it is trusted (for an object that
/// does not decode, always), the stored one otherwise.
fn previous<'s>(
    stored: Option<&'s PolicyStatus>,
    last: Option<(&'s PolicyStatus, Duration)>,
    decoded: bool,
) -> Option<&'s PolicyStatus> {
    match last {
        Some((written, age)) if !decoded || age < IN_FLIGHT => Some(written),
        _ if decoded => stored,
        _ => None,
    }
}

/// Whether `status` is written, given the stored one and this replica's last write (and its age).
fn verdict(
    status: &PolicyStatus,
    stored: Option<&PolicyStatus>,
    last: Option<(&PolicyStatus, Duration)>,
    decoded: bool,
    leader: bool,
) -> Verdict {
    let unchanged = stored == Some(status)
        || last.is_some_and(|(written, age)| written == status && (!decoded || age < IN_FLIGHT));
    if unchanged || !leader {
        return Verdict::Keep;
    }
    match last {
        Some((_, age)) if age < STATUS_INTERVAL => Verdict::Defer(STATUS_INTERVAL - age),
        _ => Verdict::Write,
    }
}

/// The statuses this replica wrote: one writer for the reconciler's every target.
#[derive(Debug, Default)]
pub struct StatusWriter {
    written: Mutex<Unconfirmed<(String, String), PolicyStatus>>,
}

impl StatusWriter {
    fn written(&self) -> std::sync::MutexGuard<'_, Unconfirmed<(String, String), PolicyStatus>> {
        self.written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Computes `target`'s status with `status_of` (given the status to make it from) and writes it when
    /// the rules above say so, publishing the event `event_of` finds in the change (given the status it
    /// replaces).
    pub async fn write(
        &self,
        client: &Client,
        recorder: &Recorder,
        target: &StatusTarget<'_>,
        leader: bool,
        status_of: impl FnOnce(Option<&PolicyStatus>) -> PolicyStatus,
        event_of: impl FnOnce(Option<&PolicyStatus>, &PolicyStatus) -> Option<Transition>,
    ) -> Result<StatusWrite, kube::Error> {
        let key = target.key();
        let now = now();
        let last = self
            .written()
            .last(&key)
            .map(|(written, at)| (written.clone(), now.saturating_duration_since(at)));
        let last = last.as_ref().map(|(written, age)| (written, *age));
        let status = status_of(previous(target.stored, last, target.decoded));
        match verdict(&status, target.stored, last, target.decoded, leader) {
            Verdict::Keep => {
                return Ok(StatusWrite {
                    status,
                    deferred: None,
                });
            }
            Verdict::Defer(wait) => {
                return Ok(StatusWrite {
                    status,
                    deferred: Some(wait),
                });
            }
            Verdict::Write => {}
        }
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &target.resource);
        let patch = serde_json::json!({
            "apiVersion": target.resource.api_version,
            "kind": target.resource.kind,
            "status": status,
        });
        api.patch_status(
            &target.name,
            &PatchParams::apply(gpuop_api::labels::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
        self.written().record(key, status.clone(), now);
        let replaced = last.map(|(written, _)| written).or(target.stored);
        if let Some(transition) = event_of(replaced, &status) {
            info!(object = %target.describe(), state = ?status.state, reason = %transition.reason, "state changed");
            let event = Event {
                type_: if transition.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: transition.reason,
                note: Some(transition.note),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(error) = recorder.publish(&event, &target.reference).await {
                warn!(%error, "cannot publish an event");
            }
        }
        Ok(StatusWrite {
            status,
            deferred: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::status::State;

    fn status(state: State) -> PolicyStatus {
        PolicyStatus {
            state,
            ..PolicyStatus::default()
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_status_is_made_from_the_last_write_while_it_is_trusted_then_from_the_stored_one() {
        let (stored, written) = (status(State::NotReady), status(State::Ready));
        let fresh = Some((&written, IN_FLIGHT - MS));
        let stale = Some((&written, IN_FLIGHT));
        assert_eq!(previous(Some(&stored), fresh, true), Some(&written));
        assert_eq!(previous(Some(&stored), stale, true), Some(&stored));
        assert_eq!(previous(Some(&stored), None, true), Some(&stored));
        // An object that does not decode has no stored status: the last write stands, however old.
        assert_eq!(previous(None, stale, false), Some(&written));
        assert_eq!(previous(None, None, false), None);
    }

    #[test]
    fn a_status_stored_or_just_written_is_not_written_again() {
        let ready = status(State::Ready);
        assert_eq!(verdict(&ready, Some(&ready), None, true, true), Verdict::Keep);
        let echo_pending = Some((&ready, IN_FLIGHT - MS));
        let stale = status(State::NotReady);
        assert_eq!(
            verdict(&ready, Some(&stale), echo_pending, true, true),
            Verdict::Keep
        );
        // Once the trust ends, a status the stored one still does not show is written again.
        let unconfirmed = Some((&ready, IN_FLIGHT));
        assert_eq!(
            verdict(&ready, Some(&stale), unconfirmed, true, true),
            Verdict::Write
        );
        // ... unless the object does not decode: nothing stored can ever show it.
        assert_eq!(verdict(&ready, None, unconfirmed, false, true), Verdict::Keep);
    }

    #[test]
    fn a_change_waits_for_the_interval_since_the_last_write() {
        let (before, after) = (status(State::NotReady), status(State::Ready));
        let just_now = Some((&before, Duration::from_millis(300)));
        assert_eq!(
            verdict(&after, Some(&before), just_now, true, true),
            Verdict::Defer(Duration::from_millis(700))
        );
        let a_while_ago = Some((&before, STATUS_INTERVAL));
        assert_eq!(
            verdict(&after, Some(&before), a_while_ago, true, true),
            Verdict::Write
        );
        assert_eq!(verdict(&after, Some(&before), None, true, true), Verdict::Write);
    }

    #[test]
    fn a_follower_writes_nothing() {
        let (before, after) = (status(State::NotReady), status(State::Ready));
        assert_eq!(verdict(&after, Some(&before), None, true, false), Verdict::Keep);
    }
}
