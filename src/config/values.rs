//! The kinds of value several tables share: durations, sizes, names and glob filters.

use super::errors::Ctx;
use std::time::Duration;
use toml::Spanned;

/// `allow`/`deny` globs (`*` and `?`): over a server's own tool names in a server's
/// `tools`, over public tool and prompt names and resource URIs in `[clients.NAME]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl Filter {
    /// No allow and no deny globs: everything passes.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    pub fn permits(&self, name: &str) -> bool {
        let allowed = self.allow.is_empty() || self.allow.iter().any(|g| glob(g, name));
        allowed && !self.deny.iter().any(|g| glob(g, name))
    }

    /// [`Filter::permits`] for public tool or prompt name `name` of `catalog`: a deny
    /// glob of the name the item would have had, had it not been renamed (a collision),
    /// hides it too (only looked up when there is a deny glob).
    pub fn permits_in(&self, catalog: &crate::catalog::Catalog, name: &str) -> bool {
        self.permits(name)
            && (self.deny.is_empty() || !catalog.denied_by_former_name(name, |n| self.deny.iter().any(|g| glob(g, n))))
    }
}

/// Glob match with `*` (any run) and `?` (one character).
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            pi += 1;
            mark = ti;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Characters allowed in public names, prefixes and the separator.
pub fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

pub(super) fn duration(cx: &mut Ctx, v: Option<&Spanned<String>>, key: &str, default: Duration) -> Duration {
    match v {
        None => default,
        Some(s) => match parse_duration(s.get_ref()) {
            Some(d) if d > MAX_DURATION => {
                cx.at(
                    s.span().start,
                    format!(
                        "{key}: {:?} is longer than the longest duration the gateway takes, 10 years",
                        s.get_ref()
                    ),
                );
                default
            }
            Some(d) => d,
            None => {
                cx.at(
                    s.span().start,
                    format!(
                        "{key}: {:?} is not a duration like \"30s\", \"500ms\" or \"2m\"",
                        s.get_ref()
                    ),
                );
                default
            }
        },
    }
}

/// As [`duration`], for a key where zero (`"0s"`, in any unit) turns a step off.
pub(super) fn duration_or_zero(cx: &mut Ctx, v: Option<&Spanned<String>>, key: &str, default: Duration) -> Duration {
    match v {
        Some(s) if is_zero_duration(s.get_ref()) => Duration::ZERO,
        _ => duration(cx, v, key, default),
    }
}

/// `"0s"`, `"0us"`, `"0ms"`, `"0m"`, `"0h"` (and `"0.0s"`).
fn is_zero_duration(s: &str) -> bool {
    let s = s.trim();
    let Some(split) = s.find(|c: char| !c.is_ascii_digit() && c != '.') else {
        return false;
    };
    let (n, unit) = s.split_at(split);
    n.parse::<f64>().is_ok_and(|n| n == 0.0) && matches!(unit.trim(), "us" | "µs" | "ms" | "s" | "m" | "h")
}

/// The longest duration a key takes: 10 years, where no clock arithmetic overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses `"200us"` (or `"200µs"`), `"500ms"`, `"30s"`, `"2m"`, `"1h"`; a value past
/// what a `Duration` holds is none.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit.trim() {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs > 0.0).then(|| Duration::try_from_secs_f64(secs).ok()).flatten()
}

/// Parses `"1048576"`, `"512KiB"`, `"16MiB"`, `"1GiB"` (also KB/MB/GB as powers of 1000).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: usize = n.parse().ok()?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult).filter(|&v| v > 0)
}

/// A size key: `default` when unset; one that is not a size is reported (0 stands in).
pub(super) fn size(cx: &mut Ctx, v: Option<&Spanned<String>>, key: &str, like: &str, default: usize) -> usize {
    let Some(s) = v else { return default };
    parse_size(s.get_ref()).unwrap_or_else(|| {
        cx.at(
            s.span().start,
            format!("{key}: {:?} is not a size like {like:?}", s.get_ref()),
        );
        0
    })
}

/// A key that takes one of a few words: `default` when unset; a word not in `words` is
/// reported (and `default` stands in).
pub(super) fn one_of<T: Copy>(
    cx: &mut Ctx,
    v: Option<&Spanned<String>>,
    key: &str,
    default: T,
    words: &[(&str, T)],
) -> T {
    let Some(s) = v else { return default };
    if let Some((_, t)) = words.iter().find(|(w, _)| w == s.get_ref()) {
        return *t;
    }
    let names: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
    cx.at(
        s.span().start,
        format!("{key}: {:?} is not one of {}", s.get_ref(), names.join(", ")),
    );
    default
}
