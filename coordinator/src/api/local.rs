//! A coordinator without tokens serves only this machine's own clients: a request must name a
//! loopback host (`Host`), and a browser's request must come from the coordinator's own page
//! (`Origin`, `Sec-Fetch-Site`). Otherwise a web page could drive it through the browser of
//! whoever runs it (a cross-site POST needs no preflight; DNS rebinding points a foreign name
//! at 127.0.0.1).

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use headroom_shared::api::ErrorCode;

use super::{ApiError, AppState};

/// The gate of a tokenless coordinator (with tokens, a browser holds no credential a foreign
/// page could use, and nothing is checked here).
pub(super) async fn loopback_only(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if s.auth.enabled() {
        return next.run(req).await;
    }
    let verdict = {
        let header = |name| {
            req.headers()
                .get(name)
                .map(|v| v.to_str().unwrap_or("\u{fffd}"))
        };
        // HTTP/2 carries the host in the URI's authority rather than a header.
        let host = header(HOST).or_else(|| req.uri().authority().map(|a| a.as_str()));
        let origin = header(ORIGIN);
        let fetch_site = header(axum::http::HeaderName::from_static("sec-fetch-site"));
        check(host, origin, fetch_site).inspect_err(|why| {
            if s.refusals.admit(std::time::Instant::now()) == super::refusals::Verdict::Skip {
                return;
            }
            tracing::warn!(
                target: "headroom::audit",
                host = host.unwrap_or_default(),
                origin = origin.unwrap_or_default(),
                path = %req.uri().path(),
                "refused: {why}"
            );
        })
    };
    match verdict {
        Ok(()) => next.run(req).await,
        Err(why) => ApiError::new(ErrorCode::Forbidden, why).into_response(),
    }
}

/// Whether a request to a tokenless coordinator is this machine's own: its `Host` is a
/// loopback name or address, and a browser's request comes from that same origin.
pub fn check(
    host: Option<&str>,
    origin: Option<&str>,
    fetch_site: Option<&str>,
) -> Result<(), String> {
    const WHY: &str = "this coordinator runs without tokens, so it answers only requests \
                       to a loopback address from this machine's own programs";
    let host = host.ok_or_else(|| format!("no Host header: {WHY}"))?;
    if !is_loopback_authority(host) {
        return Err(format!("Host `{host}` is not a loopback name: {WHY}"));
    }
    if let Some(origin) = origin {
        let same = origin
            .strip_prefix("http://")
            .is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !same {
            return Err(format!(
                "Origin `{origin}` is not this coordinator's page (http://{host}): {WHY}"
            ));
        }
    }
    if fetch_site.is_some_and(|s| s.eq_ignore_ascii_case("cross-site")) {
        return Err(format!("a cross-site request (Sec-Fetch-Site): {WHY}"));
    }
    Ok(())
}

/// `localhost`, `*.localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_authority(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((h, port)) if port.is_empty() || valid_port(port) => h,
            _ => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((h, port)) if valid_port(&format!(":{port}")) => h,
            Some(_) => return false,
            None => authority,
        },
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn valid_port(p: &str) -> bool {
    p.strip_prefix(':')
        .is_some_and(|n| !n.is_empty() && n.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_and_their_own_pages_pass() {
        for host in [
            "127.0.0.1:7420",
            "localhost:7420",
            "LOCALHOST",
            "[::1]:7420",
            "127.0.0.2",
            "app.localhost:80",
        ] {
            assert_eq!(check(Some(host), None, None), Ok(()), "{host}");
        }
        for host in [
            "evil.example:7420",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "10.0.0.1:7420",
            "[::2]:7420",
            "127.0.0.1:notaport",
            "",
        ] {
            let e = check(Some(host), None, None).expect_err(host);
            assert!(e.contains("Host"), "{e}");
        }
        assert!(check(None, None, None).is_err(), "no Host: refused");
        // The dashboard itself: the same origin.
        assert_eq!(
            check(
                Some("127.0.0.1:7420"),
                Some("http://127.0.0.1:7420"),
                Some("same-origin")
            ),
            Ok(())
        );
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:8888",
            "https://127.0.0.1:7420",
        ] {
            let e = check(Some("127.0.0.1:7420"), Some(origin), None).expect_err(origin);
            assert!(e.contains("Origin"), "{e}");
        }
        let e = check(Some("127.0.0.1:7420"), None, Some("cross-site")).expect_err("cross-site");
        assert!(e.contains("cross-site"), "{e}");
    }
}
