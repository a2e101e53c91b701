//! A busy watch read in gulps instead of event by event.
//!
//! During a rollout the API server sends pod and node events by the thousand, each a few milliseconds after
//! the last. Read one at a time, every event costs a wakeup of the connection's task and of the watch's, a
//! `read` and an `epoll_wait`: more than decoding it. [`Gulps`] reads whatever is there, and once the
//! stream has nothing more it waits [`GATHER`] before it looks again, so that what arrives meanwhile waits
//! in the socket and is read in one go. An event that comes after a quiet spell is read at once; one in a
//! busy stream waits at most [`GATHER`]. A stream is busy when its last two events came within
//! [`GATHER`] of each other: events further apart (a quiet cluster's changes, fewer than ten a second)
//! are read as they come, without the pause's timer.
//!
//! "Nothing more" is not the first time the stream says it has nothing: the connection's task hands the
//! body over frame by frame, so a stream with a socket full of events still says so between two frames.
//! It is when it still has nothing after [`PROBES`] turns of the runtime, in which the connection's task
//! could read. Pausing at every such gap instead reads one event per pause, and the API server closes a
//! watcher that falls that far behind.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::Stream;
use tokio::time::{Instant, Sleep};

/// How long a busy stream is left to gather events before it is read again. The status is written at most
/// once a second and a pass waits at least 200 ms for the next: 100 ms is not seen in either, and at
/// 10,000 nodes (about a thousand pod events a second) it reads some hundred events per wakeup.
pub const GATHER: Duration = Duration::from_millis(100);

/// How many turns of the runtime a stream that had events gets to show more before it pauses.
pub const PROBES: u8 = 4;

/// `stream`, read in gulps (see the module's doc).
#[derive(Debug)]
pub struct Gulps<S> {
    stream: S,
    gather: Duration,
    /// When the last item came.
    last: Option<Instant>,
    /// Whether the last two items came within `gather` of each other: the next time it has none, it
    /// pauses.
    busy: bool,
    /// The turns it has had nothing since its last item.
    probes: u8,
    pause: Option<Pin<Box<Sleep>>>,
}

impl<S> Gulps<S> {
    /// Reads `stream` in gulps, pausing `gather` once it has nothing more.
    pub fn new(stream: S, gather: Duration) -> Self {
        Self {
            stream,
            gather,
            last: None,
            busy: false,
            probes: 0,
            pause: None,
        }
    }
}

impl<S: Stream + Unpin> Stream for Gulps<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.get_mut();
        if let Some(pause) = &mut this.pause {
            ready!(pause.as_mut().poll(cx));
            this.pause = None;
        }
        match Pin::new(&mut this.stream).poll_next(cx) {
            Poll::Ready(item) => {
                let now = Instant::now();
                this.busy = this.last.is_some_and(|last| now - last < this.gather);
                this.last = Some(now);
                this.probes = 0;
                Poll::Ready(item)
            }
            Poll::Pending if this.busy && this.probes < PROBES => {
                // Let the connection's task run, and look again.
                this.probes += 1;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending if this.busy => {
                this.busy = false;
                this.probes = 0;
                let mut pause = Box::pin(tokio::time::sleep(this.gather));
                // Registers the timer's wakeup; a zero pause is over at once.
                if pause.as_mut().poll(cx).is_pending() {
                    this.pause = Some(pause);
                    return Poll::Pending;
                }
                Pin::new(&mut this.stream).poll_next(cx)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use futures::channel::mpsc;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_busy_stream_is_read_in_gulps_and_a_quiet_one_at_once() {
        let (sender, receiver) = mpsc::unbounded();
        let mut gulps = Gulps::new(receiver, GATHER);
        let start = Instant::now();

        // After a quiet spell, the first event is read at once, and so is all that is already there.
        sender.unbounded_send(1).unwrap();
        sender.unbounded_send(2).unwrap();
        assert_eq!(gulps.next().await, Some(1));
        assert_eq!(gulps.next().await, Some(2));
        assert_eq!(start.elapsed(), Duration::ZERO);

        // The stream ran dry after events: what comes now waits for the end of the pause, and comes
        // together with what arrived during it.
        let sent = sender.clone();
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            sent.unbounded_send(3).unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            sent.unbounded_send(4).unwrap();
        });
        assert_eq!(gulps.next().await, Some(3));
        assert_eq!(start.elapsed(), GATHER);
        assert_eq!(gulps.next().await, Some(4));
        assert_eq!(start.elapsed(), GATHER);
        late.await.unwrap();

        // Dry again: a pause with nothing in it, then quiet. An event long after is read at once.
        let sent = sender.clone();
        let quiet = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            sent.unbounded_send(5).unwrap();
        });
        assert_eq!(gulps.next().await, Some(5));
        assert_eq!(start.elapsed(), GATHER + Duration::from_secs(10));
        quiet.await.unwrap();

        drop(sender);
        assert_eq!(gulps.next().await, None);
    }

    /// A stream that has its next item only after two turns of the runtime, as a watch whose connection
    /// task hands over one frame at a time.
    struct FrameByFrame {
        polls: u32,
    }

    impl Stream for FrameByFrame {
        type Item = u32;

        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            let this = self.get_mut();
            this.polls += 1;
            if this.polls.is_multiple_of(3) {
                Poll::Ready(Some(this.polls / 3))
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    /// A stream that counts how often it is asked for an item.
    struct Counted<S> {
        stream: S,
        polls: std::sync::Arc<std::sync::atomic::AtomicU32>,
    }

    impl<S: Stream + Unpin> Stream for Counted<S> {
        type Item = S::Item;

        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
            let this = self.get_mut();
            this.polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Pin::new(&mut this.stream).poll_next(cx)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_further_apart_than_the_gathering_are_read_as_they_come() {
        let (sender, receiver) = mpsc::unbounded();
        let polls = std::sync::Arc::default();
        let counted = Counted {
            stream: receiver,
            polls: std::sync::Arc::clone(&polls),
        };
        let mut gulps = Gulps::new(counted, GATHER);
        let start = Instant::now();
        let apart = GATHER * 2;
        let sending = tokio::spawn(async move {
            for event in 0..10 {
                tokio::time::sleep(apart).await;
                sender.unbounded_send(event).unwrap();
            }
        });
        for event in 0..10 {
            assert_eq!(gulps.next().await, Some(event));
            assert_eq!(start.elapsed(), apart * (event + 1));
        }
        sending.await.unwrap();
        // Each event: the look that found nothing, and the one that found it; no probing, no pause.
        assert_eq!(polls.load(std::sync::atomic::Ordering::Relaxed), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_between_two_frames_is_not_paused() {
        let mut gulps = Gulps::new(FrameByFrame { polls: 0 }, GATHER);
        let start = Instant::now();
        for expected in 1..=100 {
            assert_eq!(gulps.next().await, Some(expected));
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
