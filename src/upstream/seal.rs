//! Sealing secrets at rest: AES-256-GCM, with a key derived per purpose (HKDF-SHA256)
//! from one root key. (The `exchange` branch owns this file; this is the stand-in the
//! consent flow builds on until it is merged.)

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// One purpose's key.
pub struct Seal {
    key: LessSafeKey,
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl Seal {
    /// The key for `purpose`, derived from `root`.
    pub fn new(root: &[u8], purpose: &str) -> Result<Seal, &'static str> {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"mcp-gateway seal v1").extract(root);
        let info = [purpose.as_bytes()];
        let mut bytes = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit (255 × 32), so neither step can fail.
        if let Ok(okm) = prk.expand(&info, Len(32)) {
            let _ = okm.fill(&mut bytes);
        }
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| "cannot make an AES-256-GCM key")?;
        Ok(Seal {
            key: LessSafeKey::new(key),
        })
    }

    /// `plaintext` sealed, bound to `aad` (what it is about): hex of nonce ‖ ciphertext ‖ tag.
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        let _ = SystemRandom::new().fill(&mut nonce);
        let mut buf = plaintext.to_vec();
        let _ = self
            .key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut buf);
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        crate::cluster::hex(&out)
    }

    /// The plaintext of what [`Seal::seal`] made with the same `aad`; `None` if it was
    /// altered, sealed for something else, or with another key.
    pub fn open(&self, aad: &[u8], sealed: &str) -> Option<Vec<u8>> {
        let mut bytes = crate::cluster::unhex(sealed)?;
        if bytes.len() < NONCE_LEN + aead::AES_256_GCM.tag_len() {
            return None;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&bytes[..NONCE_LEN]);
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut bytes[NONCE_LEN..],
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::Seal;

    #[test]
    fn opens_only_what_it_sealed_for_the_same_purpose_and_aad() {
        let a = Seal::new(b"root key of at least some length", "tokens").unwrap();
        let s = a.seal(b"alice/docs", b"secret");
        assert_eq!(a.open(b"alice/docs", &s).as_deref(), Some(&b"secret"[..]));
        assert!(a.open(b"bob/docs", &s).is_none(), "another aad");
        assert!(Seal::new(b"root key of at least some length", "other")
            .unwrap()
            .open(b"alice/docs", &s)
            .is_none());
        let mut t = s.clone().into_bytes();
        t[30] = if t[30] == b'0' { b'1' } else { b'0' };
        assert!(
            a.open(b"alice/docs", &String::from_utf8(t).unwrap()).is_none(),
            "altered"
        );
    }
}
