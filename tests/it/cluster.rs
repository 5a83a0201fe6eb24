//! `[cluster]`: replicas sharing one real Redis (issue #16).

use crate::common::*;
use std::time::Duration;

/// 32 bytes and more: the cluster key every replica of a test shares.
pub const KEY: &str = "test-cluster-key-0123456789abcdef0123456789";

pub fn cluster_toml(redis: &Redis, extra: &str) -> String {
    format!("[cluster]\nredis = \"{}\"\nkey = \"{KEY}\"\n{extra}\n", redis.url)
}

#[tokio::test]
async fn a_replica_reports_itself_and_redis_on_status() {
    let mut redis = Redis::start();
    let gw = Gateway::start(&cluster_toml(&redis, "replica_id = \"gw-a\""));
    let seen = until(Duration::from_secs(10), || {
        let s = redis.cli(&["ZCARD", "mcpgw:replicas"]);
        s.trim() == "1"
    })
    .await;
    assert!(seen, "the heartbeat reached Redis");
    let status = gw.get_json("/status").await;
    assert_eq!(status["cluster"]["replica"], "gw-a");
    assert_eq!(status["cluster"]["redis"], "up");
    redis.kill();
    let mut down = false;
    for _ in 0..100 {
        if gw.get_json("/status").await["cluster"]["redis"] == "down" {
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(down, "Redis killed shows as down");
    assert!(gw.wait_log("Redis is unreachable", Duration::from_secs(5)).await);
}
