//! A connection's work with what may end it early beside it: [`Guarded`] polls the work at every
//! wake-up of the connection's task, and what ends it early (shutdown, the idle timeout) only when that
//! future's own waker has fired.
//!
//! Why not `tokio::select!`: a select polls every branch at every wake-up, because it cannot tell
//! which branch woke the task. A relayed connection's task wakes once per message, and the shutdown
//! token's and the idle timer's futures cost about 350 instructions per poll each (a lock, their waker
//! checks): about a quarter of the router's own work per kept-alive request, spent finding that nothing
//! happened (BENCHMARKS.md, issue 18). Here the early end is polled through a waker of its own that
//! raises a flag and wakes the task, so a wake-up that only the work caused skips it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// How a [`Guarded`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended<W, S> {
    /// The work finished.
    Work(W),
    /// What may end it early finished first (the work is dropped with the `Guarded`).
    Stop(S),
}

/// The early end's waker: raises `woken`, then wakes the task that polls the [`Guarded`].
#[derive(Debug)]
struct StopWaker {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for StopWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // The flag first: the task this wakes must find it raised.
        self.woken.store(true, Ordering::Release);
        // Woken outside the lock: a waker that polls its task at once (some executors do) would
        // otherwise find the lock held by its own wake-up.
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// `work`, ended early by `stop` if `stop` finishes first. Both are polled at the first poll; after
/// that `stop` is polled only once its waker has fired.
#[derive(Debug)]
pub(crate) struct Guarded<W, S> {
    work: W,
    stop: S,
    flag: Arc<StopWaker>,
    stop_waker: Waker,
}

impl<W, S> Guarded<W, S>
where
    W: Future + Unpin,
    S: Future + Unpin,
{
    /// Pinned futures (`Pin<&mut F>`, `Pin<Box<F>>`) are `Unpin`.
    pub(crate) fn new(work: W, stop: S) -> Guarded<W, S> {
        let flag = Arc::new(StopWaker {
            // Raised, so the first poll polls `stop` and so registers its waker.
            woken: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Guarded {
            work,
            stop,
            stop_waker: Waker::from(Arc::clone(&flag)),
            flag,
        }
    }
}

impl<W, S> Future for Guarded<W, S>
where
    W: Future + Unpin,
    S: Future + Unpin,
{
    type Output = Ended<W::Output, S::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        {
            // Where `stop`'s waker finds the task: kept current before `stop` can fire again.
            let mut task = this
                .flag
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        if this.flag.woken.swap(false, Ordering::AcqRel) {
            let mut stop_cx = Context::from_waker(&this.stop_waker);
            if let Poll::Ready(s) = Pin::new(&mut this.stop).poll(&mut stop_cx) {
                return Poll::Ready(Ended::Stop(s));
            }
        }
        match Pin::new(&mut this.work).poll(cx) {
            Poll::Ready(w) => Poll::Ready(Ended::Work(w)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// A future that counts its polls and is never ready.
    struct Counted<'a>(&'a AtomicUsize);

    impl Future for Counted<'_> {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn work_that_finishes_wins() {
        let never = pin!(std::future::pending::<()>());
        let work = pin!(async { 7 });
        assert_eq!(Guarded::new(work, never).await, Ended::Work(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_ends_work_that_keeps_waking() {
        // The work wakes its task ten times a second; the timer must still be seen when it fires.
        let work = pin!(async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let stop = pin!(tokio::time::sleep(Duration::from_secs(5)));
        let start = tokio::time::Instant::now();
        assert_eq!(Guarded::new(work, stop).await, Ended::Stop(()));
        assert!(start.elapsed() >= Duration::from_secs(5));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_from_another_task_ends_idle_work() {
        let token = CancellationToken::new();
        let cancel = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            cancel.cancel();
        });
        let work = pin!(std::future::pending::<()>());
        let stop = pin!(token.cancelled());
        let ended = tokio::time::timeout(Duration::from_secs(10), Guarded::new(work, stop)).await;
        assert_eq!(ended.expect("the cancel was lost"), Ended::Stop(()));
    }

    #[tokio::test]
    async fn stop_is_polled_once_until_its_waker_fires() {
        let polls = AtomicUsize::new(0);
        let stop = pin!(Counted(&polls));
        // Work that wakes its task 100 times, then finishes.
        let work = pin!(async {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(Guarded::new(work, stop).await, Ended::Work(()));
        assert_eq!(polls.load(Ordering::Relaxed), 1);
    }

    /// A waker that counts its wake-ups.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_stop_wakes_the_waker_of_the_latest_poll() {
        // A task's waker may differ from one poll to the next: the stop must wake the latest.
        let token = CancellationToken::new();
        let (work, stop) = (pin!(std::future::pending::<()>()), pin!(token.cancelled()));
        let mut guarded = Guarded::new(work, stop);
        let (first, latest) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        for waker in [&first, &latest] {
            let waker = Waker::from(Arc::clone(waker));
            let poll = Pin::new(&mut guarded).poll(&mut Context::from_waker(&waker));
            assert!(poll.is_pending());
        }
        token.cancel();
        assert_eq!(first.0.load(Ordering::Relaxed), 0);
        assert_eq!(latest.0.load(Ordering::Relaxed), 1);
        let waker = Waker::from(latest);
        let poll = Pin::new(&mut guarded).poll(&mut Context::from_waker(&waker));
        assert_eq!(poll, Poll::Ready(Ended::Stop(())));
    }

    #[test]
    fn nothing_holds_the_task_once_the_guard_is_gone() {
        // The stop's waker holds the task's waker; dropping the guard (and so the stop) must let go.
        let token = CancellationToken::new();
        let task = Arc::new(Count(AtomicUsize::new(0)));
        {
            let (work, stop) = (pin!(std::future::pending::<()>()), pin!(token.cancelled()));
            let mut guarded = Guarded::new(work, stop);
            let waker = Waker::from(Arc::clone(&task));
            assert!(Pin::new(&mut guarded)
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
        }
        assert_eq!(Arc::strong_count(&task), 1);
        token.cancel();
        assert_eq!(task.0.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_that_wakes_without_finishing_is_polled_again() {
        // An idle-style stop: wakes every second, finishes at the fifth.
        let stop = pin!(async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            "idle"
        });
        let work = pin!(std::future::pending::<()>());
        assert_eq!(Guarded::new(work, stop).await, Ended::Stop("idle"));
    }
}
