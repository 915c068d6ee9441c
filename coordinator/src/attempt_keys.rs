//! Attempt keys: the credential issued with each lease, by which the attempt's supervisor
//! alone renews that lease and reports that attempt's end while its agent is away. Only its
//! SHA-256 is stored; the key is 192 random bits, so a plain digest (no slow hash) is enough.

use sha2::{Digest, Sha256};

/// A fresh key and the digest to store.
pub fn new_key() -> (String, String) {
    let key = headroom_shared::secret::random_hex(24);
    let digest = digest(&key);
    (key, digest)
}

fn digest(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `presented` is the key whose digest is `stored` (compared in constant time).
pub fn matches(stored: &str, presented: &str) -> bool {
    let got = digest(presented);
    got.len() == stored.len()
        && got
            .bytes()
            .zip(stored.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
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
