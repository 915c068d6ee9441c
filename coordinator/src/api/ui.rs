//! The web dashboard: one page with its script and style, embedded in the binary and served
//! at `/` under a strict content security policy (no inline script, nothing from elsewhere).
//! The page holds no data: its script asks the API with the token the person gives it, kept
//! in the browser tab's session storage, so it sees exactly what that token may see. Its
//! charts are drawn by uPlot (MIT), vendored in `ui/vendor/` and served from here too.

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use headroom_shared::api::ErrorCode;

use super::ApiError;

const INDEX: &str = include_str!("../../ui/index.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const APP_CSS: &str = include_str!("../../ui/app.css");
/// uPlot 1.6.32, unchanged from its npm package (`ui/vendor/README.md`).
const UPLOT_JS: &str = include_str!("../../ui/vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../ui/vendor/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../../ui/vendor/uPlot.LICENSE");

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

/// `GET /ui/{file}`: its script and style, and the charting library's (with its licence).
pub async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => serve(APP_JS, "text/javascript; charset=utf-8"),
        "app.css" => serve(APP_CSS, "text/css; charset=utf-8"),
        "uPlot.iife.min.js" => serve(UPLOT_JS, "text/javascript; charset=utf-8"),
        "uPlot.min.css" => serve(UPLOT_CSS, "text/css; charset=utf-8"),
        "uPlot.LICENSE" => serve(UPLOT_LICENSE, "text/plain; charset=utf-8"),
        _ => {
            ApiError::new(ErrorCode::NotFound, format!("no such file: /ui/{file}")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page names no route of the API: it finds each by its operation id in the served
    /// OpenAPI document, so a route the server changes cannot leave it calling a stale path.
    #[test]
    fn the_script_names_no_api_path() {
        assert!(!APP_JS.contains("/v1/"), "app.js names an API path itself");
        assert!(APP_JS.contains("/openapi.json"));
    }

    #[test]
    fn the_page_loads_only_its_own_script_and_style() {
        // The charting library first: app.js uses it (both deferred, run in this order).
        let uplot = INDEX
            .find(r#"<script src="/ui/uPlot.iife.min.js" defer></script>"#)
            .expect("the page loads uPlot from /ui/");
        let app = INDEX
            .find(r#"<script src="/ui/app.js" defer></script>"#)
            .expect("the page loads app.js");
        assert!(uplot < app);
        assert!(INDEX.contains(r#"href="/ui/uPlot.min.css""#));
        assert!(INDEX.contains(r#"href="/ui/app.css""#));
        // No inline script or style the policy would block, and nothing from elsewhere.
        assert_eq!(INDEX.matches("<script").count(), 2);
        assert!(!INDEX.contains("<style") && !INDEX.contains("style=\""));
        assert!(!INDEX.contains("http://") && !INDEX.contains("https://"));
        assert!(!APP_JS.contains("innerHTML") && !APP_JS.contains("eval("));
    }

    /// uPlot does nothing the policy forbids: no markup or code from strings, no `<style>`
    /// element or `style` attribute (it sets element.style properties, which is allowed).
    #[test]
    fn the_vendored_charting_library_is_uplot_and_needs_no_looser_policy() {
        assert!(UPLOT_JS.starts_with("/*! https://github.com/leeoniya/uPlot (v1.6.32) */"));
        assert!(UPLOT_LICENSE.starts_with("The MIT License (MIT)"));
        assert!(UPLOT_CSS.contains(".uplot"));
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "eval(",
            "Function(",
            "\"style\")",
            "cssText",
            "import(",
        ] {
            assert!(!UPLOT_JS.contains(forbidden), "uPlot uses {forbidden}");
        }
        // Nothing is fetched: the only address in it is its own header comment's.
        assert_eq!(UPLOT_JS.matches("http").count(), 1);
        assert!(!UPLOT_CSS.contains("url(") && !UPLOT_CSS.contains("@import"));
        assert!(!CSP.contains("unsafe") && CSP.contains("script-src 'self'"));
    }

    #[tokio::test]
    async fn the_vendored_files_are_served_with_the_policy() {
        for (file, kind) in [
            ("uPlot.iife.min.js", "text/javascript"),
            ("uPlot.min.css", "text/css"),
            ("uPlot.LICENSE", "text/plain"),
        ] {
            let r = asset(Path(file.to_string())).await;
            assert_eq!(r.status(), 200, "{file}");
            let h = r.headers();
            assert!(
                h[header::CONTENT_TYPE]
                    .to_str()
                    .is_ok_and(|t| t.starts_with(kind)),
                "{file}"
            );
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP, "{file}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{file}");
        }
        let r = asset(Path("vendor".to_string())).await;
        assert_eq!(r.status(), 404);
    }
}
