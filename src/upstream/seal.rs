//! Sealed records: ChaCha20-Poly1305 (ring's AEAD) with a fresh random nonce per record
//! and a key for each purpose, derived by HKDF-SHA256 from a master secret (the cluster
//! key, as `cluster::derive` derives its MAC keys: one label per purpose,
//! `mcp-gateway/cluster/{purpose}`), so one purpose's records never open as another's.
//!
//! The associated data binds a record to its name (the identity and server it belongs
//! to, as the caller gives them): a record copied under another identity's key in Redis
//! or a file does not open. Names are length-prefixed, so `("a:b", "c")` and
//! `("a", "b:c")` differ.
//!
//! A sealed record is text: `1.` then hex of nonce ‖ ciphertext ‖ tag.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// The format's version, first in every sealed record.
const VERSION: &str = "1.";

/// One purpose's sealing key.
pub struct Sealer {
    key: LessSafeKey,
    purpose: String,
    rng: SystemRandom,
}

/// Why a record did not open. Deliberately vague: which check failed is nobody's business.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the system's random number generator failed")]
    Random,
    #[error("the sealed record is malformed, was sealed with another key or purpose, or belongs to another name")]
    Open,
}

impl Sealer {
    /// The key for `purpose` (e.g. `upstream-token/1`) from `master` (the cluster key).
    pub fn new(master: &[u8], purpose: &str) -> Sealer {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"mcp-gateway/seal/1");
        let prk = salt.extract(master);
        let label = format!("mcp-gateway/cluster/{purpose}");
        let info = [label.as_bytes()];
        // expand() fails only for an output longer than 255 hash lengths; 32 bytes is not.
        let okm = prk.expand(&info, &CHACHA20_POLY1305);
        let key = match okm {
            Ok(okm) => UnboundKey::from(okm),
            Err(_) => unreachable_key(),
        };
        Sealer {
            key: LessSafeKey::new(key),
            purpose: purpose.to_owned(),
            rng: SystemRandom::new(),
        }
    }

    /// The key for `purpose` in cluster mode: from the cluster key, through the same
    /// per-purpose derivation as the cluster's MAC keys (`Cluster::derive`).
    pub fn from_cluster(cluster: &crate::cluster::Cluster, purpose: &str) -> Sealer {
        let mac = cluster.derive(purpose);
        let master = ring::hmac::sign(&mac, b"mcp-gateway/seal/1");
        Sealer::new(master.as_ref(), purpose)
    }

    /// Seals `plain` under `name` (e.g. `["alice", "docs"]`).
    pub fn seal(&self, name: &[&str], plain: &[u8]) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| SealError::Random)?;
        let mut buf = plain.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(self.aad(name)), &mut buf)
            .map_err(|_| SealError::Random)?;
        let mut out = Vec::with_capacity(NONCE_LEN + buf.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        Ok(format!("{VERSION}{}", crate::cluster::hex(&out)))
    }

    /// The plaintext sealed in `sealed` under `name`.
    pub fn open(&self, name: &[&str], sealed: &str) -> Result<Vec<u8>, SealError> {
        let hex = sealed.strip_prefix(VERSION).ok_or(SealError::Open)?;
        let bytes = crate::cluster::unhex(hex).ok_or(SealError::Open)?;
        if bytes.len() < NONCE_LEN + aead::CHACHA20_POLY1305.tag_len() {
            return Err(SealError::Open);
        }
        let (nonce, rest) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Open)?;
        let mut buf = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(self.aad(name)), &mut buf)
            .map_err(|_| SealError::Open)?;
        Ok(plain.to_vec())
    }

    /// The purpose, then each part of the name, each with its length before it.
    fn aad(&self, name: &[&str]) -> Vec<u8> {
        let mut aad = Vec::new();
        for part in std::iter::once(self.purpose.as_str()).chain(name.iter().copied()) {
            aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
            aad.extend_from_slice(part.as_bytes());
        }
        aad
    }
}

/// HKDF cannot fail for a 32-byte key; should ring ever say otherwise, a random key
/// (records sealed with it open only in this process) beats a panic.
fn unreachable_key() -> UnboundKey {
    let mut k = [0u8; 32];
    let _ = SystemRandom::new().fill(&mut k);
    match UnboundKey::new(&CHACHA20_POLY1305, &k) {
        Ok(k) => k,
        // A 32-byte key is what ChaCha20-Poly1305 takes: this arm is never reached.
        Err(_) => std::process::abort(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_record_opens_only_with_its_key_purpose_and_name() {
        let s = Sealer::new(KEY, "upstream-token/1");
        let sealed = s.seal(&["alice", "docs"], b"the token").unwrap();
        assert!(sealed.starts_with("1."));
        assert!(!sealed.contains("746865"), "hex of the plaintext does not show");
        assert_eq!(s.open(&["alice", "docs"], &sealed).unwrap(), b"the token");
        // A fresh nonce each time.
        assert_ne!(sealed, s.seal(&["alice", "docs"], b"the token").unwrap());

        assert_eq!(
            s.open(&["bob", "docs"], &sealed),
            Err(SealError::Open),
            "another identity"
        );
        assert_eq!(
            s.open(&["alice", "wiki"], &sealed),
            Err(SealError::Open),
            "another server"
        );
        assert_eq!(
            s.open(&["alice:docs"], &sealed),
            Err(SealError::Open),
            "names are length-prefixed"
        );
        let other_purpose = Sealer::new(KEY, "consent-token/1");
        assert_eq!(other_purpose.open(&["alice", "docs"], &sealed), Err(SealError::Open));
        let other_key = Sealer::new(b"another key of thirty-two bytes!", "upstream-token/1");
        assert_eq!(other_key.open(&["alice", "docs"], &sealed), Err(SealError::Open));

        // Tampering anywhere fails.
        let mut bytes = sealed.into_bytes();
        let last = bytes.len() - 1;
        bytes[last] = if bytes[last] == b'0' { b'1' } else { b'0' };
        let tampered = String::from_utf8(bytes).unwrap();
        assert_eq!(s.open(&["alice", "docs"], &tampered), Err(SealError::Open));
        for junk in ["", "1.", "1.zz", "2.00", "1.0011"] {
            assert_eq!(s.open(&["alice", "docs"], junk), Err(SealError::Open), "{junk:?}");
        }
    }
}
