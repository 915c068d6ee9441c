//! Attempt keys: the credential issued with each lease, by which the attempt's supervisor
//! alone renews that lease and reports that attempt's end while its agent is away. Only its
//! SHA-256 is stored; the key is 192 random bits, so a plain digest (no slow hash) is enough.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A fresh key and the digest to store.
pub fn new_key() -> (String, String) {
    let key = headroom_shared::secret::random_hex(24);
    let digest = digest(&key);
    (key, digest)
}

fn digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Whether `presented` is the key whose digest is `stored` (compared in constant time).
pub fn matches(stored: &str, presented: &str) -> bool {
    bool::from(digest(presented).as_bytes().ct_eq(stored.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_matches_its_digest_only() {
        let (key, stored) = new_key();
        assert!(matches(&stored, &key));
        let (other, _) = new_key();
        assert!(!matches(&stored, &other));
        assert!(!matches(&stored, ""));
        assert!(!matches("", &key), "no stored digest: nothing matches");
        assert_ne!(key, stored, "the key itself is not stored");
    }
}
