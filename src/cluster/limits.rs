//! Limits every replica shares, in Redis: rate limits (GCRA) and session counts
//! (`gateway.max_sessions`, `gateway.max_sessions_per_client`).
//!
//! **Cost rule.** A request whose limits are all unset makes no Redis round trip for
//! them: the router collects the limits that apply to a request (its client's and, once
//! its route is known, its server's and tool's) and calls [`Cluster::spend`] only when
//! there is at least one, so every limited request costs exactly one round trip (one
//! EVALSHA over all its buckets) and an unlimited one none. The integration test
//! `cluster_limits::calls_without_limits_make_no_redis_round_trip_and_with_limits_one`
//! counts Redis's commands to hold it.
//!
//! **Clock.** The scripts read Redis's own `TIME`, so replicas whose clocks disagree
//! still agree on every bucket.
//!
//! **Keys** (`P` = `cluster.prefix`; nothing secret in any name or value):
//! - `P:rl:c:{sha256}`: `[rate_limits] per_client`, by the SHA-256 of the client's name
//!   or of its session id (a session id is bearer-like);
//! - `P:rl:id:{name}`: a `[clients.NAME]` table's own `rate_limit` (a config name);
//! - `P:rl:s:{server}` and `P:rl:t:{server}:{tool}`: `per_server` and `per_tool`
//!   (config and tool names);
//! - `P:sessions`, `P:share:{sha256 of the share}`: sorted sets of the SHA-256 of session
//!   ids, scored by their expiry (Redis milliseconds).
//!
//! A bucket's key holds its GCRA theoretical arrival time (TAT, Redis microseconds) and
//! expires just after it, when the bucket is full again and the key means nothing.
//!
//! Every call here is bounded by [`REDIS_TIMEOUT`] as a whole, and while Redis is down
//! only one call per [`RETRY`] is tried (the others fail at once): a Redis that does
//! not answer never holds a request longer than the timeout, and `cluster.on_redis_down`
//! decides what the request gets.

use super::{digest, Cluster, REDIS_TIMEOUT};
use crate::config::{Per, Rate};
use crate::limit::Which;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

/// GCRA over several buckets at once, all or nothing.
///
/// `KEYS[i]`: a bucket's key; `ARGV[2i-1]`: its emission interval (µs, one call's worth),
/// `ARGV[2i]`: its burst. Returns `{0, 0}` when one was spent from every bucket, else
/// `{i, wait_µs}` for the bucket whose wait is longest (nothing spent from any).
static GCRA: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats = {}
local worst, wait = 0, 0
for i = 1, #KEYS do
  local interval = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or 0) or 0
  if tat < now then tat = now end
  local new = tat + interval
  local allow_at = new - interval * burst
  if allow_at > now and allow_at - now > wait then
    worst, wait = i, allow_at - now
  end
  tats[i] = new
end
if worst > 0 then return {worst, math.ceil(wait)} end
for i = 1, #KEYS do
  local ttl = math.ceil((tats[i] - now) / 1000) + 1000
  redis.call('SET', KEYS[i], string.format('%.0f', tats[i]), 'PX', ttl)
end
return {0, 0}
",
    )
});

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// While Redis is down, how long after a failed call the next one is tried.
pub const RETRY: Duration = Duration::from_millis(100);

/// This replica's record of its limits calls' failures.
#[derive(Default)]
pub struct Health {
    /// When the last one failed (ms since the epoch, this replica's clock).
    failed_at: AtomicU64,
}

/// One rate-limit bucket to spend from.
pub struct Bucket<'a> {
    /// Its Redis key (see [`Cluster::bucket_key`]).
    pub key: String,
    pub rate: &'a Rate,
}

/// Redis could not be asked: it is down, or did not answer within [`REDIS_TIMEOUT`].
/// The failure is already recorded ([`Cluster::track`]): a warning once per outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreachable;

/// What a request refused because Redis is unreachable (`on_redis_down = "refuse"`) reads.
pub fn unreachable_message() -> &'static str {
    "Redis is unreachable and cluster.on_redis_down = \"refuse\": the limits replicas share cannot be checked; try again shortly"
}

/// A rate's GCRA parameters: one call's interval in µs (rounded up) and the burst.
fn gcra(rate: &Rate) -> (u64, u32) {
    let period: u64 = match rate.per {
        Per::Second => 1_000_000,
        Per::Minute => 60_000_000,
        Per::Hour => 3_600_000_000,
    };
    let count = u64::from(rate.count.max(1));
    let burst = if rate.burst == 0 { rate.count } else { rate.burst };
    (period.div_ceil(count), burst.max(1))
}

impl Cluster {
    /// The Redis key of the bucket of limit `which`.
    pub fn bucket_key(&self, which: &Which) -> String {
        match which {
            Which::PerClient { key, named } => {
                let kind = if *named { "client" } else { "session" };
                self.name(&format!("rl:c:{}", digest(&format!("{kind}:{key}"))))
            }
            Which::Client(name) => self.name(&format!("rl:id:{name}")),
            Which::Tool { server, tool } => self.name(&format!("rl:t:{server}:{tool}")),
            Which::Server(server) => self.name(&format!("rl:s:{server}")),
        }
    }

    /// Spends one call from every bucket, or from none, in one round trip. `Ok(None)`:
    /// spent; `Ok(Some((i, wait)))`: bucket `i` binds (the longest wait), nothing spent.
    /// `buckets` must not be empty (an empty budget makes no round trip: the caller's
    /// business, see the module's cost rule).
    pub async fn spend(&self, buckets: &[Bucket<'_>]) -> Result<Option<(usize, Duration)>, Unreachable> {
        let mut call = GCRA.prepare_invoke();
        for b in buckets {
            let (interval, burst) = gcra(b.rate);
            call.key(&b.key).arg(interval).arg(burst);
        }
        let (i, wait): (usize, u64) = self.run(call).await?;
        let last = buckets.len().saturating_sub(1);
        Ok(i.checked_sub(1).map(|i| (i.min(last), Duration::from_micros(wait))))
    }

    /// Runs a script, bounded by [`REDIS_TIMEOUT`], recording Redis's health (see
    /// [`Cluster::try_now`]).
    async fn run<T: redis::FromRedisValue>(&self, call: redis::ScriptInvocation<'_>) -> Result<T, Unreachable> {
        self.try_now()?;
        let mut conn = self.conn();
        let r = tokio::time::timeout(REDIS_TIMEOUT, call.invoke_async(&mut conn)).await;
        self.settle(r)
    }

    /// While Redis is down, calls within [`RETRY`] of this replica's last failed one are
    /// not tried: an outage costs a request nothing, and the first call after it (or the
    /// heartbeat's) finds Redis back.
    fn try_now(&self) -> Result<(), Unreachable> {
        let since = super::now_ms().saturating_sub(self.limits.failed_at.load(Ordering::Relaxed));
        if !self.is_up() && since < ms(RETRY) {
            return Err(Unreachable);
        }
        Ok(())
    }

    fn settle<T>(&self, r: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>) -> Result<T, Unreachable> {
        let r = r.unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} ms", REDIS_TIMEOUT.as_millis()),
            )))
        });
        self.track(r).map_err(|e| {
            self.limits.failed_at.store(super::now_ms(), Ordering::Relaxed);
            tracing::debug!(error = %e, "a shared limits call failed");
            Unreachable
        })
    }
}

/// `gateway.max_sessions` and `gateway.max_sessions_per_client` over all replicas. The
/// HTTP front's session table calls these (until it does, only the tests do).
#[cfg_attr(not(test), allow(dead_code))]
mod sessions {
    use super::{digest, ms, unreachable_message, Cluster, Unreachable, REDIS_TIMEOUT};
    use std::sync::LazyLock;
    use std::time::Duration;

    /// Drops expired sessions from both sets, checks both counts, adds the session.
    ///
    /// `KEYS[1]`: `P:sessions`, `KEYS[2]`: `P:share:{..}`; `ARGV`: the session's member, the
    /// total maximum, the share's maximum, the TTL in ms. Returns 0 (taken, or already held
    /// and refreshed), 1 (the total is full) or 2 (the share is full).
    static TAKE: LazyLock<redis::Script> = LazyLock::new(|| {
        redis::Script::new(&format!(
            r"{SESSION_LUA}
local member, ttl = ARGV[1], tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], member) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 1 end
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return 2 end
end
local expiry = string.format('%.0f', now + ttl)
redis.call('ZADD', KEYS[1], expiry, member)
redis.call('ZADD', KEYS[2], expiry, member)
keep(KEYS[1])
keep(KEYS[2])
return 0
"
        ))
    });

    /// Marks sessions alive until now + TTL (adding them again if Redis lost them).
    ///
    /// `KEYS[1]`: `P:sessions`, `KEYS[1 + i]`: session i's share set; `ARGV[1]`: the TTL
    /// in ms, `ARGV[1 + i]`: session i's member.
    static TOUCH: LazyLock<redis::Script> = LazyLock::new(|| {
        redis::Script::new(&format!(
            r"{SESSION_LUA}
local expiry = string.format('%.0f', now + tonumber(ARGV[1]))
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[1], expiry, ARGV[i])
  redis.call('ZADD', KEYS[i], expiry, ARGV[i])
  keep(KEYS[i])
end
keep(KEYS[1])
return 0
"
        ))
    });

    /// What both session scripts start with: Redis's time in ms, and `keep(key)`, which
    /// makes a set expire with its last member.
    const SESSION_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function keep(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', key, last[2]) end
end
";

    /// Why a session could not be counted in.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum SessionLimit {
        /// `gateway.max_sessions` sessions are open over all replicas.
        Total { max: usize },
        /// Its share (`client 'alice'`, `address …`) has `gateway.max_sessions_per_client`.
        PerClient { max: usize },
        /// Redis could not be asked: `cluster.on_redis_down` decides (count locally, or 503).
        Unreachable,
    }

    impl SessionLimit {
        /// What the client reads (the same wording as a single process's).
        pub fn message(&self, share: &str) -> String {
            match self {
                SessionLimit::Total { max } => {
                    format!(
                        "the gateway has {max} open sessions, its limit (gateway.max_sessions); end one or try later"
                    )
                }
                SessionLimit::PerClient { max } => format!(
                "{share} has {max} open sessions, its limit (gateway.max_sessions_per_client); end one or try later"
            ),
                SessionLimit::Unreachable => unreachable_message().to_owned(),
            }
        }
    }

    impl Cluster {
        /// Counts session `sid` of `share` (whose share of `max_sessions_per_client` it is:
        /// `client 'alice'`, `address 10.0.0.7`) in, unless `max_total` sessions are open over
        /// all replicas or `max_share` for that share; it counts until `ttl` from now unless
        /// touched ([`Cluster::touch_sessions`]) or released. Taking a session already held
        /// only refreshes it. Neither the id nor the share is stored: their SHA-256 is.
        pub async fn take_session(
            &self,
            sid: &str,
            share: &str,
            max_total: usize,
            max_share: usize,
            ttl: Duration,
        ) -> Result<(), SessionLimit> {
            let mut call = TAKE.prepare_invoke();
            call.key(self.name("sessions"))
                .key(self.share_key(share))
                .arg(session_member(sid))
                .arg(max_total)
                .arg(max_share)
                .arg(ms(ttl));
            match self.run::<u8>(call).await {
                Ok(0) => Ok(()),
                Ok(1) => Err(SessionLimit::Total { max: max_total }),
                Ok(_) => Err(SessionLimit::PerClient { max: max_share }),
                Err(Unreachable) => Err(SessionLimit::Unreachable),
            }
        }

        /// Counts session `sid` of `share` out (it ended). Best effort: with Redis down it
        /// expires by itself.
        pub async fn release_session(&self, sid: &str, share: &str) {
            let member = session_member(sid);
            let mut pipe = redis::pipe();
            pipe.zrem(self.name("sessions"), &member)
                .ignore()
                .zrem(self.share_key(share), &member)
                .ignore();
            let _ = self.run_pipe(&pipe).await;
        }

        /// Marks `sessions` (id, share) alive for `ttl` more, in one round trip; sessions
        /// Redis lost (a restart) are counted again.
        pub async fn touch_sessions(&self, sessions: &[(&str, &str)], ttl: Duration) {
            if sessions.is_empty() {
                return;
            }
            let mut call = TOUCH.prepare_invoke();
            call.key(self.name("sessions")).arg(ms(ttl));
            for (sid, share) in sessions {
                call.key(self.share_key(share)).arg(session_member(sid));
            }
            let _ = self.run::<u8>(call).await;
        }

        fn share_key(&self, share: &str) -> String {
            self.name(&format!("share:{}", digest(share)))
        }

        async fn run_pipe(&self, pipe: &redis::Pipeline) -> Result<(), Unreachable> {
            if !self.is_up() {
                return Err(Unreachable);
            }
            let mut conn = self.conn();
            let r = tokio::time::timeout(REDIS_TIMEOUT, pipe.query_async::<()>(&mut conn)).await;
            self.settle(r)
        }
    }

    /// A session's member in the session sets: the SHA-256 of its id (as in every other
    /// key that names a session, [`super::digest`]).
    pub(super) fn session_member(sid: &str) -> String {
        digest(sid)
    }
}

#[cfg_attr(not(test), allow(unused_imports))]
pub use sessions::SessionLimit;

/// Against a real `redis-server` (Debian's, or Valkey's) on a unix socket.
#[cfg(test)]
pub(crate) mod tests {
    use super::sessions::session_member;
    use super::*;
    use crate::config::{self, OnRedisDown, Secret};
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;

    /// A `redis-server` of its own, killed on drop.
    pub(crate) struct Server {
        child: Child,
        dir: tempfile::TempDir,
    }

    impl Server {
        pub(crate) fn start() -> Server {
            let dir = tempfile::tempdir().unwrap();
            let sock = dir.path().join("redis.sock");
            let bin = ["redis-server", "valkey-server"]
                .into_iter()
                .find(|b| Command::new(b).arg("--version").output().is_ok())
                .expect("redis-server is installed");
            let child = Command::new(bin)
                .args(["--port", "0", "--save", "", "--appendonly", "no"])
                .arg("--unixsocket")
                .arg(&sock)
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::os::unix::net::UnixStream::connect(&sock).is_err() {
                assert!(std::time::Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(10));
            }
            Server { child, dir }
        }

        /// A new replica's handle on it.
        pub(crate) fn cluster(&self) -> Arc<Cluster> {
            let url = format!("redis+unix://{}", self.dir.path().join("redis.sock").display());
            Cluster::start(&config::Cluster {
                redis: Secret::new(url),
                key: Secret::new("k".repeat(32)),
                on_redis_down: OnRedisDown::Local,
                prefix: "t".into(),
                replica_id: Some("r".into()),
                advertise: None,
            })
            .unwrap()
        }

        fn kill(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.kill();
        }
    }

    fn rate(s: &str) -> Rate {
        Rate::parse(s).unwrap()
    }

    #[tokio::test]
    async fn gcra_spends_all_or_nothing_and_says_which_binds() {
        let server = Server::start();
        let c = server.cluster();
        let (five, two) = (rate("5/m"), rate("2/m"));
        let wide = Bucket {
            key: c.name("rl:a"),
            rate: &five,
        };
        let narrow = || Bucket {
            key: c.name("rl:b"),
            rate: &two,
        };
        let both = [
            Bucket {
                key: c.name("rl:a"),
                rate: &five,
            },
            narrow(),
        ];
        assert_eq!(c.spend(&both).await, Ok(None));
        assert_eq!(c.spend(&both).await, Ok(None));
        // The narrow bucket is empty: nothing is spent from the wide one either.
        for _ in 0..3 {
            let (i, wait) = c.spend(&both).await.unwrap().unwrap();
            assert_eq!(i, 1, "the 2/m bucket binds");
            assert!(
                wait > Duration::from_secs(25) && wait <= Duration::from_secs(30),
                "{wait:?}"
            );
        }
        // The wide bucket still has its 3 of 5.
        for _ in 0..3 {
            assert_eq!(c.spend(std::slice::from_ref(&wide)).await, Ok(None));
        }
        assert!(c.spend(&[wide]).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn gcra_refills_at_its_rate_by_redis_time() {
        let server = Server::start();
        let c = server.cluster();
        let r = rate("20/s burst 2");
        let b = [Bucket {
            key: c.name("rl:r"),
            rate: &r,
        }];
        assert_eq!(c.spend(&b).await, Ok(None));
        assert_eq!(c.spend(&b).await, Ok(None));
        let (_, wait) = c.spend(&b).await.unwrap().unwrap();
        assert!(wait <= Duration::from_millis(50), "{wait:?}");
        tokio::time::sleep(wait).await;
        assert_eq!(c.spend(&b).await, Ok(None), "waiting the advertised time is enough");
    }

    #[tokio::test]
    async fn sessions_count_over_all_replicas_until_released_or_expired() {
        let server = Server::start();
        let (a, b) = (server.cluster(), server.cluster());
        let ttl = Duration::from_secs(60);
        assert_eq!(a.take_session("s1", "client 'alice'", 3, 2, ttl).await, Ok(()));
        assert_eq!(b.take_session("s2", "client 'alice'", 3, 2, ttl).await, Ok(()));
        assert_eq!(
            a.take_session("s3", "client 'alice'", 3, 2, ttl).await,
            Err(SessionLimit::PerClient { max: 2 })
        );
        assert_eq!(
            a.take_session("s1", "client 'alice'", 3, 2, ttl).await,
            Ok(()),
            "taking a held session again refreshes it"
        );
        assert_eq!(b.take_session("s3", "client 'bob'", 3, 2, ttl).await, Ok(()));
        assert_eq!(
            b.take_session("s4", "client 'bob'", 3, 2, ttl).await,
            Err(SessionLimit::Total { max: 3 })
        );
        a.release_session("s1", "client 'alice'").await;
        assert_eq!(b.take_session("s4", "client 'bob'", 3, 2, ttl).await, Ok(()));
        // Expiry: a short-lived session frees its place by itself; a touched one stays.
        let short = Duration::from_millis(200);
        let (x, y) = (server.cluster(), "address 10.0.0.1");
        assert_eq!(x.take_session("e1", y, 10, 2, short).await, Ok(()));
        assert_eq!(x.take_session("e2", y, 10, 2, short).await, Ok(()));
        x.touch_sessions(&[("e2", y)], ttl).await;
        assert_eq!(
            x.take_session("e3", y, 10, 2, ttl).await,
            Err(SessionLimit::PerClient { max: 2 })
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(x.take_session("e3", y, 10, 2, ttl).await, Ok(()), "e1 expired");
        assert_eq!(
            x.take_session("e4", y, 10, 2, ttl).await,
            Err(SessionLimit::PerClient { max: 2 })
        );
        assert_eq!(
            SessionLimit::PerClient { max: 2 }.message(y),
            "address 10.0.0.1 has 2 open sessions, its limit (gateway.max_sessions_per_client); end one or try later"
        );
    }

    #[tokio::test]
    async fn nothing_secret_is_stored() {
        let server = Server::start();
        let c = server.cluster();
        let sid = "0123456789abcdef-session-secret";
        c.take_session(sid, "client 'alice'", 5, 5, Duration::from_secs(60))
            .await
            .unwrap();
        let mut conn = c.conn();
        let keys: Vec<String> = redis::cmd("KEYS").arg("t:*").query_async(&mut conn).await.unwrap();
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg("t:sessions")
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        for s in keys.iter().chain(&members) {
            assert!(!s.contains(sid) && !s.contains("alice"), "{s}");
        }
        assert_eq!(members, vec![session_member(sid)]);
        let which = Which::PerClient { key: sid, named: false };
        assert!(!c.bucket_key(&which).contains(sid));
    }

    #[tokio::test]
    async fn a_dead_redis_is_unreachable_at_once_and_a_silent_one_within_the_timeout() {
        let mut server = Server::start();
        let c = server.cluster();
        let r = rate("5/s");
        let b = [Bucket {
            key: c.name("rl:x"),
            rate: &r,
        }];
        assert_eq!(c.spend(&b).await, Ok(None));
        server.kill();
        let started = std::time::Instant::now();
        assert_eq!(c.spend(&b).await, Err(Unreachable));
        assert!(!c.is_up());
        assert_eq!(c.spend(&b).await, Err(Unreachable), "not tried while down");
        assert_eq!(
            c.take_session("s", "x", 1, 1, Duration::from_secs(1)).await,
            Err(SessionLimit::Unreachable)
        );
        assert!(started.elapsed() <= REDIS_TIMEOUT * 2, "{:?}", started.elapsed());

        // A Redis that accepts and never answers: the timeout, not a hang.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("silent.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                open.push(s);
            }
        });
        let silent = Cluster::start(&config::Cluster {
            redis: Secret::new(format!("redis+unix://{}", sock.display())),
            key: Secret::new("k".repeat(32)),
            on_redis_down: OnRedisDown::Refuse,
            prefix: "t".into(),
            replica_id: None,
            advertise: None,
        })
        .unwrap();
        let started = std::time::Instant::now();
        assert_eq!(silent.spend(&b).await, Err(Unreachable));
        assert!(
            started.elapsed() < REDIS_TIMEOUT + Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        held.abort();
    }
}
