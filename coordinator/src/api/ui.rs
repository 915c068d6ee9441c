//! The web dashboard: one page with its script and style, embedded in the binary and served
//! at `/` under a strict content security policy (no inline script, nothing from elsewhere).
//! The page holds no data: its script asks the API with the token the person gives it, kept
//! in the browser tab's session storage, so it sees exactly what that token may see.

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use headroom_shared::api::ErrorCode;

use super::ApiError;

const INDEX: &str = include_str!("../../ui/index.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const APP_CSS: &str = include_str!("../../ui/app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

fn serve(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The login link carries the token in the fragment, which no request sends; no page
    // address leaves this one either.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// `GET /`: the dashboard.
pub async fn page() -> Response {
    serve(INDEX, "text/html; charset=utf-8")
}

/// `GET /ui/{file}`: its script and style.
pub async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => serve(APP_JS, "text/javascript; charset=utf-8"),
        "app.css" => serve(APP_CSS, "text/css; charset=utf-8"),
        _ => {
            ApiError::new(ErrorCode::NotFound, format!("no such file: /ui/{file}")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_script_and_style() {
        assert!(INDEX.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(INDEX.contains(r#"href="/ui/app.css""#));
        // No inline script or style the policy would block, and nothing from elsewhere.
        assert_eq!(INDEX.matches("<script").count(), 1);
        assert!(!INDEX.contains("<style") && !INDEX.contains("style=\""));
        assert!(!INDEX.contains("http://") && !INDEX.contains("https://"));
        assert!(!APP_JS.contains("innerHTML") && !APP_JS.contains("eval("));
    }
}
