//! Which nodes a join token may make: the names an admin decided when making it, written as
//! patterns (`gpu-*`, `node-0?`, `dgx-a`), and the lifetime of what it makes. Pure: no I/O.

/// Most patterns one join token names.
const MAX_PATTERNS: usize = 64;

/// Checks the patterns an admin gives a join token: one or more, each a node name in which
/// `*` stands for any run of characters and `?` for one. `field` names them in errors.
pub fn check_patterns(patterns: &[String]) -> Result<(), String> {
    if patterns.is_empty() {
        return Err(
            "a join token names the nodes it may make: give one or more names or \
                    patterns, such as `gpu-*` (`*` any run of characters, `?` one)"
                .to_string(),
        );
    }
    if patterns.len() > MAX_PATTERNS {
        return Err(format!("at most {MAX_PATTERNS} names or patterns"));
    }
    for p in patterns {
        let ok = !p.is_empty()
            && p.len() <= 64
            && p.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | '*' | '?')
            });
        if !ok {
            return Err(format!(
                "`{p}` is not a node name or pattern: 1 to 64 letters, digits, `_ - . @`, \
                 `*` (any run) and `?` (one character)"
            ));
        }
    }
    Ok(())
}

/// Whether `node` is one of the nodes `patterns` name.
pub fn allows(patterns: &[String], node: &str) -> bool {
    patterns.iter().any(|p| glob(p.as_bytes(), node.as_bytes()))
}

/// `*` and `?` over bytes (names are ASCII), with one backtrack point: linear enough for
/// names of 64 characters.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Splits a comma-separated list (a flag's value) into patterns.
pub fn parse_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pats(list: &str) -> Vec<String> {
        parse_list(list)
    }

    #[test]
    fn names_and_patterns_choose_nodes() {
        let p = pats("gpu-*, dgx-a,node-0?");
        for yes in [
            "gpu-1",
            "gpu-",
            "gpu-rack2-7",
            "dgx-a",
            "node-01",
            "node-0x",
        ] {
            assert!(allows(&p, yes), "{yes}");
        }
        for no in ["gpu", "xgpu-1", "dgx-b", "dgx-a2", "node-012", "node-0", ""] {
            assert!(!allows(&p, no), "{no}");
        }
        assert!(allows(&pats("*"), "anything"));
        assert!(allows(&pats("a*b*c"), "aXXbYYc"));
        assert!(!allows(&pats("a*b*c"), "aXXbYY"));
    }

    #[test]
    fn patterns_are_checked() {
        assert!(check_patterns(&[]).is_err());
        assert!(check_patterns(&pats("gpu-*,a?")).is_ok());
        let e = check_patterns(&pats("gpu-[0-9]")).expect_err("brackets");
        assert!(e.contains("gpu-[0-9]"), "{e}");
        assert!(check_patterns(&["".to_string()]).is_err());
    }

    proptest! {
        /// A pattern without wildcards matches exactly itself; `*` alone matches anything.
        #[test]
        fn plain_names_match_only_themselves(a in "[a-z0-9-]{1,12}", b in "[a-z0-9-]{1,12}") {
            prop_assert!(allows(std::slice::from_ref(&a), &a));
            prop_assert_eq!(allows(std::slice::from_ref(&a), &b), a == b);
            prop_assert!(allows(&["*".to_string()], &b));
            let prefixed = format!("{a}*");
            let joined = format!("{a}{b}");
            prop_assert!(allows(std::slice::from_ref(&prefixed), &joined));
        }
    }
}
