//! HTTP to a coordinator from synchronous test code: the shared typed client and its runtime,
//! JSON and text requests by full URL, and a free loopback port for a server to listen on.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use headroom_shared::client::Client;
use headroom_shared::routes::Method;
use serde::de::DeserializeOwned;

/// The runtime every synchronous helper drives the typed client on: one for the process,
/// so the client's pooled connections outlive a single call.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("test-http")
        .enable_all()
        .build()?;
    Ok(RT.get_or_init(|| rt))
}

/// Runs a future of the typed client to completion from synchronous test code.
pub fn block_on<T>(fut: impl std::future::Future<Output = T>) -> Result<T> {
    Ok(runtime()?.block_on(fut))
}

/// The typed client of the coordinator serving `url` (one per coordinator, shared).
pub fn client_for(url: &str) -> Result<Client> {
    static CLIENTS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, Client>>,
    > = std::sync::OnceLock::new();
    let base = base_of(url).to_string();
    let mut map = CLIENTS
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| anyhow!("client cache poisoned"))?;
    if let Some(c) = map.get(&base) {
        return Ok(c.clone());
    }
    let c = Client::new(&base)?;
    map.insert(base, c.clone());
    Ok(c)
}

/// `http://host:port` of a URL.
fn base_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// A free TCP port on the loopback, for a server that must come back on the same address.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// GET a JSON document by full URL, failing on a non-2xx answer.
pub fn http_get<T: DeserializeOwned>(url: &str) -> Result<T> {
    let c = client_for(url)?;
    let path = &url[base_of(url).len()..];
    let (status, body) = block_on(c.raw(Method::Get, path, None))??;
    if !(200..300).contains(&status) {
        bail!("GET {url}: {status}: {body}");
    }
    Ok(serde_json::from_value(body)?)
}

/// POST JSON; the status and body whatever the status.
pub fn http_post(url: &str, body: &serde_json::Value) -> Result<(u16, serde_json::Value)> {
    let c = client_for(url)?;
    let path = &url[base_of(url).len()..];
    Ok(block_on(c.raw(Method::Post, path, Some(body)))??)
}

/// POST a text body by full URL; the status and the answer's text whatever the status.
pub fn http_post_text(url: &str, body: &str) -> Result<(u16, String)> {
    text_request(reqwest::Method::POST, url, Some(body.to_string()))
}

/// GET by full URL; the status and the answer's text whatever the status (for answers that
/// are not JSON, such as a log).
pub fn http_get_text(url: &str) -> Result<(u16, String)> {
    text_request(reqwest::Method::GET, url, None)
}

fn text_request(method: reqwest::Method, url: &str, body: Option<String>) -> Result<(u16, String)> {
    static HTTP: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let http = HTTP
        .get_or_init(|| {
            headroom_shared::client::http_builder()
                .build()
                .expect("an HTTP client")
        })
        .clone();
    let mut req = http
        .request(method.clone(), url)
        .timeout(Duration::from_secs(30));
    if let Some(body) = body {
        req = req.body(body);
    }
    block_on(async move {
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    })?
}
