//! A remote server's `max_connections` slots, shared fairly among its callers.
//!
//! A plain semaphore queues waiters first come, first served: one client that sends a
//! thousand slow calls to a server of 256 slots takes all of them, and every other
//! teammate's call waits behind the 744 that are queued. Here each caller has a queue of
//! its own, and a slot that frees goes to the callers that wait in turn (round robin):
//! another caller's call waits for one slot to free, not for the flood. A caller alone
//! still gets every slot, and a slot is never left free while anyone waits.
//!
//! Turns are taken at two levels ([`Caller`]): among clients (a `[clients.NAME]` or OAuth
//! identity, else the address the caller comes from), then among that client's sessions.
//! So a client without an identity that opens a thousand sessions gets one turn in the
//! rounds, as many as a teammate with one session, not a thousand; and two sessions of one
//! address (teammates on one host) still take turns with each other.
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

/// Who is waiting: its client (`group`, a hash of its identity or address) and its session
/// within the client (`member`); 0 and 0: the gateway's own call, told apart from no
/// other. Only fairness rests on them, so two callers that collide merely share a turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    pub group: u64,
    pub member: u64,
}

impl Caller {
    /// The gateway's own calls (lists, pings): no client's.
    pub const NONE: Caller = Caller { group: 0, member: 0 };
}

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
    /// Clients with a waiter, each once, in the order their turns come.
    turns: VecDeque<u64>,
    /// Each waiting client's sessions and their waiters.
    groups: HashMap<u64, Group, foldhash::fast::FixedState>,
}

/// One client's waiters.
#[derive(Default)]
struct Group {
    /// Its sessions with a waiter, each once, in the order their turns come.
    turns: VecDeque<u64>,
    /// Each waiting session's waiters, oldest first.
    waiting: HashMap<u64, VecDeque<oneshot::Sender<Slot>>, foldhash::fast::FixedState>,
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
                groups: HashMap::default(),
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
            let State { turns, groups, .. } = &mut *st;
            let group = groups.entry(caller.group).or_default();
            if group.waiting.is_empty() {
                turns.push_back(caller.group);
            }
            let queue = group.waiting.entry(caller.member).or_default();
            if queue.is_empty() {
                group.turns.push_back(caller.member);
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
    /// Hands free slots to waiters: clients in turn, each client's sessions in turn, a
    /// session's oldest first. Slots whose receivers were gone go to `lost`, to be dropped
    /// once the lock is released (they are already counted free again).
    fn hand_out(&mut self, shared: &Arc<Mutex<State>>, lost: &mut Vec<Slot>) {
        while self.held < self.slots {
            let Some(g) = self.turns.pop_front() else { break };
            let Some(group) = self.groups.get_mut(&g) else {
                continue;
            };
            group.hand_one(shared, &mut self.held, lost);
            if group.waiting.is_empty() {
                self.groups.remove(&g);
            } else {
                self.turns.push_back(g);
            }
        }
    }
}

impl Group {
    /// Hands one slot to the first of its sessions in turn that still waits.
    fn hand_one(&mut self, shared: &Arc<Mutex<State>>, held: &mut usize, lost: &mut Vec<Slot>) {
        while let Some(member) = self.turns.pop_front() {
            let Some(queue) = self.waiting.get_mut(&member) else {
                continue;
            };
            let mut sent = false;
            while let Some(tx) = queue.pop_front() {
                if tx.is_closed() {
                    continue;
                }
                *held += 1;
                match tx.send(Slot {
                    state: shared.clone(),
                    live: true,
                }) {
                    Ok(()) => {
                        sent = true;
                        break;
                    }
                    Err(mut slot) => {
                        // Gone between the check and the send: the slot stays free.
                        *held -= 1;
                        slot.live = false;
                        lost.push(slot);
                    }
                }
            }
            if queue.is_empty() {
                self.waiting.remove(&member);
            } else {
                self.turns.push_back(member);
            }
            if sent {
                return;
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
        let State { turns, groups, .. } = &mut *st;
        let Caller { group: g, member } = self.caller;
        let Some(group) = groups.get_mut(&g) else { return };
        if let Some(queue) = group.waiting.get_mut(&member) {
            queue.retain(|tx| !tx.is_closed());
            if queue.is_empty() {
                group.waiting.remove(&member);
                group.turns.retain(|m| *m != member);
            }
        }
        if group.waiting.is_empty() {
            groups.remove(&g);
            turns.retain(|c| *c != g);
        }
    }
}

/// The fairness key of a caller: its client is its identity's name if it has one, else
/// `client` (what a caller without an identity counts as: its address, see
/// [`crate::client::counted_as`]); its member is its session (a stateless caller's id).
pub fn caller(identity: Option<&str>, client: &str, session: &str) -> Caller {
    use std::hash::BuildHasher;
    let hash = |key: (u8, &str)| foldhash::fast::FixedState::with_seed(0x6d63_7067).hash_one(key) | 1;
    Caller {
        group: hash(identity.map_or((2, client), |i| (1, i))),
        member: hash((3, session)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A client with one session.
    fn c(n: u64) -> Caller {
        Caller { group: n, member: n }
    }

    async fn settled() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// With the one slot of `slots` held, each of `waiters` waits for it in turn (settled
    /// before the next); then the slot is freed: the order the waiters got it in.
    async fn order_of(slots: &FairSlots, waiters: &[(Caller, &'static str)]) -> Vec<&'static str> {
        let held = slots.acquire(c(1)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for &(caller, tag) in waiters {
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
        let got = crate::sync::lock(&order).clone();
        got
    }

    /// One caller's flood waits its turn: the other caller's call gets the next slot that
    /// frees, then the flood's calls get theirs in order.
    #[tokio::test]
    async fn a_freed_slot_goes_to_the_next_caller_in_turn() {
        let slots = FairSlots::new(1);
        let order = order_of(&slots, &[(c(1), "a1"), (c(1), "a2"), (c(1), "a3"), (c(2), "b1")]).await;
        assert_eq!(order, ["a1", "b1", "a2", "a3"]);
        assert_eq!(slots.available(), 1);
    }

    /// Waiters that give up (a timeout, a cancellation) leave no slot taken and no place
    /// in line; a slot handed to a waiter just as it gave up goes to the next one.
    #[tokio::test]
    async fn waiters_that_give_up_take_nothing() {
        let slots = FairSlots::new(2);
        let a = slots.acquire(c(1)).await;
        let b = slots.acquire(c(2)).await;
        for caller in [1, 2, 3] {
            let gave_up = tokio::time::timeout(Duration::from_millis(1), slots.acquire(c(caller))).await;
            assert!(gave_up.is_err());
        }
        assert!(crate::sync::lock(&slots.state).groups.is_empty());
        assert!(crate::sync::lock(&slots.state).turns.is_empty());
        // A slot sent to a waiter whose future is then dropped before it polls again.
        let mut late = Box::pin(slots.acquire(c(4)));
        assert!(futures::poll!(late.as_mut()).is_pending());
        drop(a);
        drop(late);
        assert_eq!(slots.available(), 1);
        drop(b);
        assert_eq!(slots.available(), 2);
        let _c = slots.acquire(c(5)).await;
        let _d = slots.acquire(c(5)).await;
        assert_eq!(slots.available(), 0);
    }

    /// A lowered number of slots holds back waiters until fewer than it are held; a raised
    /// one hands the new slots to waiters at once, in turn.
    #[tokio::test]
    async fn the_number_of_slots_can_change_while_they_are_held() {
        let slots = FairSlots::new(4);
        let held: Vec<Slot> = futures::future::join_all((0..4).map(|_| slots.acquire(c(1)))).await;
        slots.limit(2);
        assert_eq!(slots.available(), 0);
        let mut next = Box::pin(slots.acquire(c(2)));
        let mut held = held.into_iter();
        drop(held.next());
        drop(held.next());
        assert!(futures::poll!(next.as_mut()).is_pending(), "three held of two slots");
        drop(held.next());
        let next = next.await;
        assert_eq!(slots.available(), 0);
        let mut waiting: Vec<_> = (0..3).map(|n| Box::pin(slots.acquire(c(10 + n)))).collect();
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

    /// A client's many sessions get one turn among clients between them: another
    /// client's call goes next, then the client's sessions take turns among themselves.
    #[tokio::test]
    async fn a_clients_sessions_share_its_turn() {
        let slots = FairSlots::new(1);
        let flood = |member| Caller { group: 7, member };
        let waiters = [
            (flood(1), "x1"),
            (flood(2), "y1"),
            (flood(3), "z1"),
            (flood(1), "x2"),
            (c(2), "b1"),
            (c(2), "b2"),
        ];
        assert_eq!(order_of(&slots, &waiters).await, ["x1", "b1", "y1", "b2", "z1", "x2"]);
        assert_eq!(slots.available(), 1);
    }

    #[test]
    fn callers_are_told_apart_by_identity_then_address_then_session() {
        // An identity's sessions are one client, whatever address they come from.
        let a1 = caller(Some("alice"), "10.0.0.1", "s1");
        let a2 = caller(Some("alice"), "10.0.0.2", "s2");
        assert_eq!(a1.group, a2.group);
        assert_ne!(a1.member, a2.member);
        assert_ne!(a1.group, caller(Some("bob"), "10.0.0.1", "s1").group);
        // Without one, the address is the client.
        let n1 = caller(None, "10.0.0.1", "s1");
        assert_eq!(n1.group, caller(None, "10.0.0.1", "s9").group);
        assert_ne!(n1.group, caller(None, "10.0.0.2", "s1").group);
        // An identity named like an address is not that address.
        assert_ne!(caller(Some("10.0.0.1"), "x", "s1").group, n1.group);
        assert_ne!(n1, Caller::NONE);
    }
}
