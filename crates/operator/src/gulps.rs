//! A busy watch read in gulps instead of event by event.
//!
//! During a rollout the API server sends pod and node events by the thousand, each a few milliseconds after
//! the last. Read one at a time, every event costs a wakeup of the connection's task and of the watch's, a
//! `read` and an `epoll_wait`: more than decoding it. [`Gulps`] reads whatever is there, and once the
//! stream has nothing more it waits [`GATHER`] before it looks again, so that what arrives meanwhile waits
//! in the socket and is read in one go. An event that comes after a quiet spell is read at once; one in a
//! busy stream waits at most [`GATHER`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::Stream;
use tokio::time::Sleep;

/// How long a busy stream is left to gather events before it is read again. The status is written at most
/// once a second and a pass waits at least 200 ms for the next: 25 ms is not seen in either.
pub const GATHER: Duration = Duration::from_millis(25);

/// `stream`, read in gulps (see the module's doc).
#[derive(Debug)]
pub struct Gulps<S> {
    stream: S,
    gather: Duration,
    /// Whether an item came since the stream last paused: the next time it has none, it pauses.
    busy: bool,
    pause: Option<Pin<Box<Sleep>>>,
}

impl<S> Gulps<S> {
    /// Reads `stream` in gulps, pausing `gather` once it has nothing more.
    pub fn new(stream: S, gather: Duration) -> Self {
        Self {
            stream,
            gather,
            busy: false,
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
                this.busy = true;
                Poll::Ready(item)
            }
            Poll::Pending if this.busy => {
                this.busy = false;
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
}
