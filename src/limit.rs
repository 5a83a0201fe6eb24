//! Rate limits (GCRA, via governor), checked before any downstream is touched:
//! per client (its session, or "stdio"), per server, per tool of a server, and per IP
//! before a request body is even parsed.

use crate::config::{Rate, RateLimits};
use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

/// A limit that was hit: what it is, and when to try again.
#[derive(Debug, Clone, PartialEq)]
pub struct Limited {
    /// e.g. `per_client limit 20/s`, `server 'github' per_tool limit for create_issue 1/m`.
    pub what: String,
    pub retry_after: Duration,
}

impl Limited {
    /// Rounded up: waiting exactly this long is always enough.
    pub fn retry_after_ms(&self) -> u64 {
        u64::try_from(self.retry_after.as_nanos().div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The sentence a client (or a model) reads; the wait is rounded up to 0.1 s.
    pub fn message(&self) -> String {
        let tenths = self.retry_after.as_nanos().div_ceil(100_000_000).max(1);
        format!(
            "Rate limit exceeded ({}). Retry after {}.{} s.",
            self.what,
            tenths / 10,
            tenths % 10
        )
    }
}

/// Which limit a [`Limited`] names: its wording, on one process and on a cluster alike.
#[derive(Debug, Clone, Copy)]
pub enum Which<'a> {
    /// `[rate_limits] per_client`, counted under `key`: a client's name when `named`,
    /// else its session id.
    PerClient { key: &'a str, named: bool },
    /// A `[clients.NAME]` table's own `rate_limit`.
    Client(&'a str),
    /// A server's `per_tool` limit for one of its tools (by the server's own name).
    Tool { server: &'a str, tool: &'a str },
    /// A server's `per_server` limit.
    Server(&'a str),
}

impl Which<'_> {
    /// What a client reads: `per_client limit 20/s`, `server 'github' limit 100/m` ...
    pub fn what(&self, rate: &Rate) -> String {
        match self {
            Which::PerClient { .. } => format!("per_client limit {rate}"),
            Which::Client(name) => format!("client '{name}' limit {rate}"),
            Which::Tool { server, tool } => format!("server '{server}' limit for tool {tool} {rate}"),
            Which::Server(server) => format!("server '{server}' limit {rate}"),
        }
    }
}

/// Every limiter of the gateway.
pub struct Limits {
    per_client: Option<(DefaultKeyedRateLimiter<String>, Rate)>,
    per_ip: Option<(DefaultKeyedRateLimiter<IpAddr>, Rate)>,
    /// Indexed like the servers in gateway.toml.
    servers: Vec<ServerLimits>,
}

#[derive(Default)]
struct ServerLimits {
    name: String,
    per_server: Option<(DefaultDirectRateLimiter, Rate)>,
    /// Keyed by the server's own tool name.
    per_tool: HashMap<String, (DefaultDirectRateLimiter, Rate)>,
}

/// The governor quota of a configured rate (its burst defaults to its count).
pub(crate) fn quota(r: &Rate) -> Quota {
    let one = NonZeroU32::MIN;
    let n = NonZeroU32::new(r.count).unwrap_or(one);
    let burst = NonZeroU32::new(r.burst).unwrap_or(n);
    let q = match r.per {
        crate::config::Per::Second => Quota::per_second(n),
        crate::config::Per::Minute => Quota::per_minute(n),
        crate::config::Per::Hour => Quota::per_hour(n),
    };
    q.allow_burst(burst)
}

impl Limits {
    /// `servers` gives each server's name and limits, in gateway.toml order.
    pub fn new(global: &RateLimits, servers: &[(String, RateLimits)]) -> Limits {
        Limits {
            per_client: global.per_client.clone().map(|r| (RateLimiter::keyed(quota(&r)), r)),
            per_ip: global.per_ip.clone().map(|r| (RateLimiter::keyed(quota(&r)), r)),
            servers: servers
                .iter()
                .map(|(name, l)| ServerLimits {
                    name: name.clone(),
                    per_server: l.per_server.clone().map(|r| (RateLimiter::direct(quota(&r)), r)),
                    per_tool: l
                        .per_tool
                        .iter()
                        .map(|(tool, r)| (tool.clone(), (RateLimiter::direct(quota(r)), r.clone())))
                        .collect(),
                })
                .collect(),
        }
    }

    /// Checks (and spends) the client's own limit.
    pub fn check_client(&self, client: &str) -> Result<(), Limited> {
        let Some((l, rate)) = &self.per_client else {
            return Ok(());
        };
        l.check_key(&client.to_owned()).map_err(|n| {
            let which = Which::PerClient {
                key: client,
                named: false,
            };
            limited(which.what(rate), n.wait_time_from(l.clock().now()))
        })
    }

    /// Checks the pre-parse limit for an address.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Limited> {
        let Some((l, rate)) = &self.per_ip else { return Ok(()) };
        l.check_key(&ip)
            .map_err(|n| limited(format!("per_ip limit {rate}"), n.wait_time_from(l.clock().now())))
    }

    /// Checks a call to `server`, and to its tool `tool` when given.
    pub fn check_server(&self, server: usize, tool: Option<&str>) -> Result<(), Limited> {
        let Some(s) = self.servers.get(server) else {
            return Ok(());
        };
        let per_tool = tool.and_then(|t| s.per_tool.get(t));
        // The limiters' own clock, read once, and only when a limit applies: building a
        // new quanta clock per call would run CPUID each time.
        let Some(clock) = per_tool.or(s.per_server.as_ref()).map(|(l, _)| l.clock()) else {
            return Ok(());
        };
        let now = clock.now();
        if let Some((l, rate)) = per_tool {
            l.check().map_err(|n| {
                let tool = tool.unwrap_or_default();
                let which = Which::Tool { server: &s.name, tool };
                limited(which.what(rate), n.wait_time_from(now))
            })?;
        }
        if let Some((l, rate)) = &s.per_server {
            l.check()
                .map_err(|n| limited(Which::Server(&s.name).what(rate), n.wait_time_from(now)))?;
        }
        Ok(())
    }

    /// `[rate_limits] per_client`, if set.
    pub fn per_client(&self) -> Option<&Rate> {
        self.per_client.as_ref().map(|(_, r)| r)
    }

    /// The limits of a call to server number `server` (and to its tool `tool`, when
    /// given), without spending them: `per_tool`'s first, then `per_server`'s.
    pub fn of_server<'a>(
        &'a self,
        server: usize,
        tool: Option<&'a str>,
    ) -> impl Iterator<Item = (Which<'a>, &'a Rate)> {
        let s = self.servers.get(server);
        let per_tool = s.zip(tool).and_then(|(s, t)| {
            let (_, rate) = s.per_tool.get(t)?;
            Some((
                Which::Tool {
                    server: &s.name,
                    tool: t,
                },
                rate,
            ))
        });
        let per_server = s.and_then(|s| s.per_server.as_ref().map(|(_, r)| (Which::Server(&s.name), r)));
        per_tool.into_iter().chain(per_server)
    }

    /// Forgets clients and addresses that have not been seen for a while.
    pub fn shrink(&self) {
        if let Some((l, _)) = &self.per_client {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some((l, _)) = &self.per_ip {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

fn limited(what: String, retry_after: Duration) -> Limited {
    Limited { what, retry_after }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_waits_round_up() {
        let l = |ns| limited("x".into(), Duration::from_nanos(ns));
        assert_eq!(l(199_600_000).retry_after_ms(), 200);
        assert_eq!(l(200_000_000).retry_after_ms(), 200);
        assert_eq!(l(1).retry_after_ms(), 1);
        assert!(l(440_000_000).message().ends_with("Retry after 0.5 s."));
        assert!(l(40_000_000).message().ends_with("Retry after 0.1 s."));
        assert!(l(20_000_000_000).message().ends_with("Retry after 20.0 s."));
        assert!(l(0).message().ends_with("Retry after 0.1 s."));
    }
}
