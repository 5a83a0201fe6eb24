//! A remote server's `max_connections` slots, shared fairly among its callers.
//!
//! A plain semaphore queues waiters first come, first served: one client that sends a
//! thousand slow calls to a server of 256 slots takes all of them, and every other
//! teammate's call waits behind the 744 that are queued. Here each caller (its
//! `[clients.NAME]` or OAuth identity, else its session; a stateless request without an
//! identity is its address's, as the stateless client is named) has a queue of its own,
//! and a slot
//! that frees goes to the callers that wait in turn (round robin): another caller's call
//! waits for one slot to free, not for the flood. A caller alone still gets every slot, and
//! a slot is never left free while anyone waits.
//!
//! Why not a cap per caller: with few callers it leaves slots idle, and a cap of
//! `max_connections / callers` changes as callers come and go; turns give the same bound on
//! waiting without either.
//!
//! The number of slots can change while they are held ([`FairSlots::limit`]): over HTTP/2
//! the server's own stream limit may be lower than `max_connections`, and a call past it
//! would wait in hyper's first-come queue on the connection instead of here
//! (`downstream/client.rs`). Lowered, the slots held beyond the new number are kept until
//! they end, and no slot is handed out until fewer than that are held.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Who is waiting: a hash of the caller's identity or session (0: a caller with neither).
/// Only fairness rests on it, so two callers that collide merely share a turn.
pub type Caller = u64;

/// `n` slots (at least one), handed out in turns among callers.
#[derive(Clone)]
pub struct FairSlots {
    state: Arc<Mutex<State>>,
    /// `slots` as last set, written under the lock only: [`FairSlots::limit`], called on
    /// every POST, takes the lock only when the number changes.
    slots: Arc<AtomicUsize>,
}

struct State {
    /// Slots there are, and slots held (which may be more, just after [`FairSlots::limit`]
    /// lowered `slots`).
    slots: usize,
    held: usize,
    /// Callers with a waiter, each once, in the order their turns come.
    turns: VecDeque<Caller>,
    /// Each waiting caller's waiters, oldest first.
    waiting: HashMap<Caller, VecDeque<oneshot::Sender<Slot>>, foldhash::fast::FixedState>,
}

/// A slot, held until dropped.
pub struct Slot {
    state: Arc<Mutex<State>>,
    /// False for a slot that never reached its waiter (already counted free again).
    live: bool,
}

impl FairSlots {
    pub fn new(n: usize) -> FairSlots {
        FairSlots {
            state: Arc::new(Mutex::new(State {
                slots: n.max(1),
                held: 0,
                turns: VecDeque::new(),
                waiting: HashMap::default(),
            })),
            slots: Arc::new(AtomicUsize::new(n.max(1))),
        }
    }

    /// A slot for `caller`: at once if one is free and nobody waits, else when its turn
    /// comes. Dropping the future gives up its place (and a slot it was just handed).
    pub async fn acquire(&self, caller: Caller) -> Slot {
        let rx = {
            let mut st = crate::sync::lock(&self.state);
            if st.held < st.slots && st.turns.is_empty() {
                st.held += 1;
                return Slot {
                    state: self.state.clone(),
                    live: true,
                };
            }
            let (tx, rx) = oneshot::channel();
            let State { turns, waiting, .. } = &mut *st;
            let queue = waiting.entry(caller).or_default();
            if queue.is_empty() {
                turns.push_back(caller);
            }
            queue.push_back(tx);
            rx
        };
        let mut waiter = Waiter {
            state: &self.state,
            caller,
            rx: Some(rx),
        };
        match waiter.rx.as_mut() {
            Some(rx) => match rx.await {
                Ok(slot) => {
                    waiter.rx = None;
                    slot
                }
                // Senders leave the queue only to be sent a slot (or when their receiver
                // is gone), so this cannot happen; wait for a slot the plain way.
                Err(_) => {
                    drop(waiter);
                    Box::pin(self.acquire(caller)).await
                }
            },
            None => unreachable!("the receiver is taken only after it answered"),
        }
    }

    /// Makes the slots `n` (at least one) from now on: a raised number goes to waiters at
    /// once; a lowered one takes effect as held slots end.
    pub fn limit(&self, n: usize) {
        let n = n.max(1);
        if self.slots.load(Ordering::Relaxed) == n {
            return;
        }
        let mut lost = Vec::new();
        {
            let mut st = crate::sync::lock(&self.state);
            if st.slots == n {
                return;
            }
            st.slots = n;
            self.slots.store(n, Ordering::Relaxed);
            st.hand_out(&self.state, &mut lost);
        }
        drop(lost);
    }

    /// Slots free now.
    #[cfg(test)]
    pub fn available(&self) -> usize {
        let st = crate::sync::lock(&self.state);
        st.slots.saturating_sub(st.held)
    }
}

impl State {
    /// Hands free slots to waiters, a caller's oldest first, callers in turn. Slots whose
    /// receivers were gone go to `lost`, to be dropped once the lock is released (they are
    /// already counted free again).
    fn hand_out(&mut self, shared: &Arc<Mutex<State>>, lost: &mut Vec<Slot>) {
        while self.held < self.slots {
            let Some(caller) = self.turns.pop_front() else { break };
            let Some(queue) = self.waiting.get_mut(&caller) else {
                continue;
            };
            while let Some(tx) = queue.pop_front() {
                if tx.is_closed() {
                    continue;
                }
                self.held += 1;
                match tx.send(Slot {
                    state: shared.clone(),
                    live: true,
                }) {
                    Ok(()) => break,
                    Err(mut slot) => {
                        // Gone between the check and the send: the slot stays free.
                        self.held -= 1;
                        slot.live = false;
                        lost.push(slot);
                    }
                }
            }
            if queue.is_empty() {
                self.waiting.remove(&caller);
            } else {
                self.turns.push_back(caller);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let mut lost = Vec::new();
        {
            let mut st = crate::sync::lock(&self.state);
            st.held -= 1;
            st.hand_out(&self.state, &mut lost);
        }
        drop(lost);
    }
}

/// A place in a caller's queue, given up when the wait is dropped.
struct Waiter<'a> {
    state: &'a Arc<Mutex<State>>,
    caller: Caller,
    rx: Option<oneshot::Receiver<Slot>>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        rx.close();
        // A slot sent before the close is ours: dropping it (outside the lock) frees it
        // for the next in turn.
        if let Ok(slot) = rx.try_recv() {
            drop(slot);
        }
        let mut st = crate::sync::lock(self.state);
        let State { turns, waiting, .. } = &mut *st;
        if let Some(queue) = waiting.get_mut(&self.caller) {
            queue.retain(|tx| !tx.is_closed());
            if queue.is_empty() {
                waiting.remove(&self.caller);
                turns.retain(|c| *c != self.caller);
            }
        }
    }
}

/// The fairness key of a caller: its identity's name if it has one, else its session id
/// (a stateless client's id: `stateless:` and its address), else 0.
pub fn caller(identity: Option<&str>, session: Option<&str>) -> Caller {
    use std::hash::BuildHasher;
    match identity.map(|i| (1u8, i)).or(session.map(|s| (2u8, s))) {
        Some(key) => foldhash::fast::FixedState::with_seed(0x6d63_7067).hash_one(key) | 1,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn settled() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// One caller's flood waits its turn: the other caller's call gets the next slot that
    /// frees, then the flood's calls get theirs in order.
    #[tokio::test]
    async fn a_freed_slot_goes_to_the_next_caller_in_turn() {
        let slots = FairSlots::new(1);
        let held = slots.acquire(1).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (caller, tag) in [(1, "a1"), (1, "a2"), (1, "a3"), (2, "b1")] {
            let (slots, order) = (slots.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let slot = slots.acquire(caller).await;
                crate::sync::lock(&order).push(tag);
                drop(slot);
            }));
            settled().await;
        }
        drop(held);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(*crate::sync::lock(&order), ["a1", "b1", "a2", "a3"]);
        assert_eq!(slots.available(), 1);
    }

    /// Waiters that give up (a timeout, a cancellation) leave no slot taken and no place
    /// in line; a slot handed to a waiter just as it gave up goes to the next one.
    #[tokio::test]
    async fn waiters_that_give_up_take_nothing() {
        let slots = FairSlots::new(2);
        let a = slots.acquire(1).await;
        let b = slots.acquire(2).await;
        for caller in [1, 2, 3] {
            let gave_up = tokio::time::timeout(Duration::from_millis(1), slots.acquire(caller)).await;
            assert!(gave_up.is_err());
        }
        assert!(crate::sync::lock(&slots.state).waiting.is_empty());
        assert!(crate::sync::lock(&slots.state).turns.is_empty());
        // A slot sent to a waiter whose future is then dropped before it polls again.
        let mut late = Box::pin(slots.acquire(4));
        assert!(futures::poll!(late.as_mut()).is_pending());
        drop(a);
        drop(late);
        assert_eq!(slots.available(), 1);
        drop(b);
        assert_eq!(slots.available(), 2);
        let _c = slots.acquire(5).await;
        let _d = slots.acquire(5).await;
        assert_eq!(slots.available(), 0);
    }

    /// A lowered number of slots holds back waiters until fewer than it are held; a raised
    /// one hands the new slots to waiters at once, in turn.
    #[tokio::test]
    async fn the_number_of_slots_can_change_while_they_are_held() {
        let slots = FairSlots::new(4);
        let held: Vec<Slot> = futures::future::join_all((0..4).map(|_| slots.acquire(1))).await;
        slots.limit(2);
        assert_eq!(slots.available(), 0);
        let mut next = Box::pin(slots.acquire(2));
        let mut held = held.into_iter();
        drop(held.next());
        drop(held.next());
        assert!(futures::poll!(next.as_mut()).is_pending(), "three held of two slots");
        drop(held.next());
        let next = next.await;
        assert_eq!(slots.available(), 0);
        let mut waiting: Vec<_> = (0..3).map(|c| Box::pin(slots.acquire(10 + c))).collect();
        for w in &mut waiting {
            assert!(futures::poll!(w.as_mut()).is_pending());
        }
        slots.limit(4);
        let mut got = Vec::new();
        for w in &mut waiting {
            if let std::task::Poll::Ready(slot) = futures::poll!(w.as_mut()) {
                got.push(slot);
            }
        }
        assert_eq!(got.len(), 2, "the two new slots went to two of the three waiters");
        drop((next, held, got, waiting));
        assert_eq!(slots.available(), 4);
        slots.limit(0);
        assert_eq!(slots.available(), 1, "at least one slot");
    }

    #[test]
    fn callers_are_told_apart_by_identity_then_session() {
        assert_eq!(caller(None, None), 0);
        assert_ne!(caller(Some("alice"), None), caller(Some("bob"), None));
        assert_eq!(caller(Some("alice"), Some("s1")), caller(Some("alice"), Some("s2")));
        assert_ne!(caller(None, Some("alice")), caller(Some("alice"), None));
        assert_ne!(caller(None, Some("s1")), 0);
    }
}
