//! `gateway.max_connections_per_address`: the client connections each address holds open,
//! counted when one is accepted and given back when its task ends, as nginx's
//! `limit_conn` counts them. Without it one address could take every connection slot,
//! and every other client's new connections would wait in the kernel's backlog.
//!
//! An IPv4 address counts alone; IPv6 addresses count by their /64. A /64 is what one
//! host or one site is given (SLAAC and privacy addresses let a host use any address in
//! it, so it could open each connection from another one), as a v4 client behind NAT
//! shares its one address. An IPv4-mapped IPv6 peer (a dual-stack listener's view of a
//! v4 client) counts as its IPv4 address.
//!
//! The count is taken on accept only: a request on a kept-alive connection pays nothing.
//! The table is sharded (a `DashMap`), and each accept or close holds one shard's lock
//! for one lookup. It keeps an entry only while its address has a connection open, so it
//! holds at most as many entries as there are connection slots. Keys are a peer's
//! addresses, which a peer picks (any of 2^64 /64s in a /0 it routes): SipHash, seeded
//! per process, so no one can aim a flood of keys at one shard's bucket.

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// What one count is kept under: an IPv4 address, or the /64 of an IPv6 one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Key {
    V4(Ipv4Addr),
    /// The address's first 64 bits.
    V6(u64),
}

impl Key {
    pub fn of(ip: IpAddr) -> Key {
        match ip {
            IpAddr::V4(v4) => Key::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Key::V4(v4),
                None => Key::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::V4(v4) => write!(f, "{v4}"),
            Key::V6(net) => write!(f, "{}/64", Ipv6Addr::from(u128::from(*net) << 64)),
        }
    }
}

/// Open connections by [`Key`]; an address with none has no entry.
#[derive(Default)]
pub struct PerAddress {
    open: DashMap<Key, usize>,
}

/// One connection's place in its address's count, given back when dropped: however the
/// connection's task ends (closed, failed, panicked, dropped at shutdown).
pub struct Held {
    table: Arc<PerAddress>,
    key: Key,
}

impl PerAddress {
    /// Takes one of `ip`'s `max` connections; its key when it holds `max` already.
    pub fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Result<Held, Key> {
        let key = Key::of(ip);
        match self.open.entry(key) {
            Entry::Occupied(mut open) => {
                if *open.get() >= max {
                    return Err(key);
                }
                *open.get_mut() += 1;
            }
            Entry::Vacant(none) => {
                if max == 0 {
                    return Err(key);
                }
                none.insert(1);
            }
        }
        Ok(Held {
            table: self.clone(),
            key,
        })
    }

    /// How many connections `ip`'s key holds open.
    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> usize {
        self.open.get(&Key::of(ip)).map_or(0, |n| *n)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The entry is there: this connection is counted in it. An address's last
        // connection takes its entry away.
        self.table.open.remove_if_mut(&self.key, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_holds_at_most_max_and_gets_each_back_when_dropped() {
        let t = Arc::new(PerAddress::default());
        let a = ip("192.0.2.1");
        let mut held: Vec<Held> = (0..3).map(|_| t.take(a, 3).unwrap()).collect();
        assert_eq!(t.take(a, 3).err(), Some(Key::V4("192.0.2.1".parse().unwrap())));
        // A refusal counted nothing; another address has its own count.
        assert_eq!(t.open(a), 3);
        let other = t.take(ip("192.0.2.2"), 3).unwrap();
        held.pop();
        assert_eq!(t.open(a), 2);
        held.push(t.take(a, 3).unwrap());
        assert_eq!(t.open(a), 3);
        drop(other);
        drop(held);
        assert!(t.open.is_empty());
    }

    #[test]
    fn the_last_connection_of_an_address_takes_its_entry_away() {
        let t = Arc::new(PerAddress::default());
        for i in 0..100u8 {
            drop(t.take(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)), 1).unwrap());
        }
        assert!(t.open.is_empty());
        assert!(t.take(ip("10.0.0.1"), 0).is_err(), "a max of 0 admits none");
        assert!(t.open.is_empty());
    }

    #[test]
    fn a_count_is_given_back_when_its_task_panics() {
        let t = Arc::new(PerAddress::default());
        let held = t.take(ip("192.0.2.9"), 1).unwrap();
        let r = std::thread::spawn(move || {
            let _held = held;
            panic!("the connection's task failed");
        })
        .join();
        assert!(r.is_err());
        assert!(t.open.is_empty());
        assert!(t.take(ip("192.0.2.9"), 1).is_ok());
    }

    #[test]
    fn ipv6_counts_by_its_64_and_a_mapped_v4_as_v4() {
        let t = Arc::new(PerAddress::default());
        let _a = t.take(ip("2001:db8:1:2::1"), 2).unwrap();
        let _b = t.take(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), 2).unwrap();
        let full = t.take(ip("2001:db8:1:2::3"), 2).err();
        assert_eq!(full.map(|k| k.to_string()).as_deref(), Some("2001:db8:1:2::/64"));
        assert!(t.take(ip("2001:db8:1:3::1"), 2).is_ok(), "the next /64 is another");
        let _v4 = t.take(ip("192.0.2.7"), 1).unwrap();
        assert!(t.take(ip("::ffff:192.0.2.7"), 1).is_err(), "a mapped v4 is that v4");
    }
}
