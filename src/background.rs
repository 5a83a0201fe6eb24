//! Every task the gateway spawns, tracked: [`spawn`] instead of `tokio::spawn`, so
//! shutdown knows what is still running ([`running`]).
//!
//! One tracker for the process: tasks are spawned from deep inside connections, pipes
//! and supervisors, and passing a handle to each would touch every constructor for no
//! gain. Tests that run several gateways in one process share it, which only makes
//! [`running`] count them all.

use std::future::Future;
use std::sync::LazyLock;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

static TRACKER: LazyLock<TaskTracker> = LazyLock::new(TaskTracker::new);

/// Spawns `task` on the current runtime, tracked.
#[track_caller]
pub fn spawn<F>(task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    TRACKER.spawn(task)
}

/// Spawns `task` on `runtime`, tracked.
#[track_caller]
pub fn spawn_on<F>(task: F, runtime: &tokio::runtime::Handle) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    TRACKER.spawn_on(task, runtime)
}

/// How many spawned tasks have not finished.
pub fn running() -> usize {
    TRACKER.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tracked_tasks_are_counted_until_they_end() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = spawn(async move {
            let _ = rx.await;
        });
        // Other tests of this binary may spawn too: ours counts at least.
        assert!(running() >= 1);
        drop(tx);
        task.await.unwrap();
    }
}
