//! `[rate_limits]` (`per_client`, `per_ip`) and a server's own `rate_limits`
//! (`per_server`, `per_tool`): rates like `"20/s"`, `"5/m"` or `"100/h burst 10"`.

use super::errors::Ctx;
use indexmap::IndexMap;
use serde::Deserialize;
use std::fmt;
use toml::Spanned;

/// `[rate_limits]`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGlobalLimits {
    per_client: Option<Spanned<String>>,
    per_ip: Option<Spanned<String>>,
}

/// `[servers.NAME] rate_limits`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServerLimits {
    per_server: Option<Spanned<String>>,
    #[serde(default)]
    per_tool: IndexMap<String, Spanned<String>>,
}

/// Rate limits; which fields apply depends on where they were written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateLimits {
    pub per_client: Option<Rate>,
    pub per_ip: Option<Rate>,
    pub per_server: Option<Rate>,
    /// Keyed by the server's own tool name.
    pub per_tool: Vec<(String, Rate)>,
}

/// Per which period a rate counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Per {
    Second,
    Minute,
    Hour,
}

/// `"N/s"`, `"N/m"` or `"N/h"`, optionally followed by `" burst B"` (default burst N).
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub per: Per,
    pub burst: u32,
}

impl Rate {
    pub fn parse(s: &str) -> Option<Rate> {
        let mut words = s.split_whitespace();
        let (n, per) = words.next()?.split_once('/')?;
        let count: u32 = n.parse().ok().filter(|&c| c > 0)?;
        let per = match per {
            "s" => Per::Second,
            "m" => Per::Minute,
            "h" => Per::Hour,
            _ => return None,
        };
        let burst = match (words.next(), words.next(), words.next()) {
            (None, _, _) => count,
            (Some("burst"), Some(b), None) => b.parse().ok().filter(|&b| b > 0)?,
            _ => return None,
        };
        Some(Rate { count, per, burst })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = match self.per {
            Per::Second => "s",
            Per::Minute => "m",
            Per::Hour => "h",
        };
        write!(f, "{}/{per}", self.count)?;
        if self.burst != self.count {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

/// `[rate_limits]`: the limits over all servers.
pub(super) fn parse(cx: &mut Ctx, raw: &RawGlobalLimits) -> RateLimits {
    RateLimits {
        per_client: rate(cx, raw.per_client.as_ref(), "rate_limits.per_client"),
        per_ip: rate(cx, raw.per_ip.as_ref(), "rate_limits.per_ip"),
        ..RateLimits::default()
    }
}

/// `[servers.NAME] rate_limits`: the limits of one server and of its tools.
pub(super) fn parse_server(cx: &mut Ctx, raw: &RawServerLimits, name: &str) -> RateLimits {
    RateLimits {
        per_server: rate(
            cx,
            raw.per_server.as_ref(),
            &format!("servers.{name}.rate_limits.per_server"),
        ),
        per_tool: raw
            .per_tool
            .iter()
            .filter_map(|(tool, r)| {
                rate(cx, Some(r), &format!("servers.{name}.rate_limits.per_tool.{tool}")).map(|r| (tool.clone(), r))
            })
            .collect(),
        ..RateLimits::default()
    }
}

pub(super) fn rate(cx: &mut Ctx, v: Option<&Spanned<String>>, key: &str) -> Option<Rate> {
    let v = v?;
    let r = Rate::parse(v.get_ref());
    if r.is_none() {
        cx.at(
            v.span().start,
            format!(
                "{key}: {:?} is not a rate like \"20/s\", \"5/m\" or \"100/h burst 10\"",
                v.get_ref()
            ),
        );
    }
    r
}
