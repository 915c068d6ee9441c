//! The coordinator reaches a PostgreSQL that requires TLS, in libpq's words: `require`
//! encrypts, `verify-full` checks the server's certificate against `sslrootcert` and its host
//! name, `verify-ca` the certificate alone, and a server the CA does not vouch for is refused.
//! Needs the throwaway cluster `scripts/test` starts with TLS (`HEADROOM_TEST_DATABASE_CA`).

use headroom_coordinator::store::Store;
use headroom_coordinator::store::postgres::PostgresStore;

fn server() -> Option<(String, String)> {
    let url = std::env::var("HEADROOM_TEST_DATABASE_URL").ok()?;
    match std::env::var("HEADROOM_TEST_DATABASE_CA") {
        Ok(ca) => Some((url, ca)),
        Err(_) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true, but HEADROOM_TEST_DATABASE_CA is not set: run scripts/test"
            );
            eprintln!("no HEADROOM_TEST_DATABASE_CA (scripts/test sets it): skipped");
            None
        }
    }
}

/// `url` with `query` added to its own.
fn with(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

async fn connects(url: &str) -> Result<i64, String> {
    let store = PostgresStore::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    store.schema_version().await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_store_reaches_postgresql_over_tls_as_libpq_would() {
    let Some((url, ca)) = server() else {
        return;
    };
    // Encrypted: the server sees this session over TLS.
    let required = with(&url, "sslmode=require&application_name=hr-tls-test");
    assert!(connects(&required).await.is_ok());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("a plain session to look");
    tokio::spawn(connection);
    let store = PostgresStore::connect(&required).await.expect("store");
    // A session of the pool, held open by the pool after this.
    store.schema_version().await.expect("a query");
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid \
             WHERE s.ssl AND a.application_name = 'hr-tls-test'",
            &[],
        )
        .await
        .expect("pg_stat_ssl");
    let encrypted: i64 = row.get(0);
    assert!(encrypted >= 1, "no session of the store is encrypted");
    drop(store);

    // Checked: the run's own CA vouches for 127.0.0.1 (and for no other name).
    let root = format!("sslrootcert={}", ca.replace('/', "%2F"));
    assert!(
        connects(&with(&url, &format!("sslmode=verify-full&{root}")))
            .await
            .is_ok()
    );
    let e = connects(&with(&url, "sslmode=verify-full"))
        .await
        .expect_err("a server no trusted CA vouches for");
    assert!(
        e.contains("certificate") || e.contains("UnknownIssuer"),
        "{e}"
    );
    let by_name = url.replace("127.0.0.1", "localhost");
    let e = connects(&with(&by_name, &format!("sslmode=verify-full&{root}")))
        .await
        .expect_err("a name the certificate does not hold");
    assert!(e.contains("certificate") || e.contains("Name"), "{e}");
    assert!(
        connects(&with(&by_name, &format!("sslmode=verify-ca&{root}")))
            .await
            .is_ok(),
        "verify-ca checks the chain, not the name"
    );
    let e = connects(&with(&url, "sslmode=verify-everything"))
        .await
        .expect_err("an unknown mode");
    assert!(e.contains("sslmode"), "{e}");
}
