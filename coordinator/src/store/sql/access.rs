//! Tokens and users: their statements, over `Exec`.

use async_trait::async_trait;
use headroom_shared::api::{Role, UserLimits, UserView};

use super::super::exec::{Arg, Exec};
use super::super::rows::{self, Cols, opt_i64};
use super::super::tx::AccessTx;
use super::super::{Millis, NewToken, Result, StoredToken};
use super::{all, done, first};

#[async_trait]
impl<E: Exec> AccessTx for E {
    async fn insert_token(&mut self, t: &NewToken, now: Millis) -> Result<bool> {
        let n = self
            .execute(
                "INSERT INTO tokens (id, name, role, secret_hash, created_by, created_at, \
                 expires_at, nodes, secret_digest) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (id) DO NOTHING",
                args![
                    &t.id,
                    &t.name,
                    t.role.as_str(),
                    &t.secret_hash,
                    &t.created_by,
                    now,
                    t.expires_at,
                    match &t.nodes {
                        Some(n) => super::super::exec::json(n)?,
                        None => Arg::Null,
                    },
                    t.secret_digest.as_deref()
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn token(&mut self, id: &str) -> Result<Option<StoredToken>> {
        let sql = format!("SELECT {} FROM tokens WHERE id = $1", rows::TOKEN_COLUMNS);
        first(self, &sql, args![id], |r| rows::token_row(r)).await
    }

    async fn tokens(&mut self) -> Result<Vec<StoredToken>> {
        let sql = format!(
            "SELECT {} FROM tokens ORDER BY created_at, id",
            rows::TOKEN_COLUMNS
        );
        all(self, &sql, &[], |r| rows::token_row(r)).await
    }

    async fn revoke_token(&mut self, id: &str, now: Millis) -> Result<bool> {
        let sql = "UPDATE tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2";
        Ok(self.execute(sql, args![now, id]).await? == 1)
    }

    async fn keep_token_digest(&mut self, id: &str, digest: &str) -> Result<bool> {
        let sql = "UPDATE tokens SET secret_digest = $1 WHERE id = $2 AND secret_digest IS NULL";
        Ok(self.execute(sql, args![digest, id]).await? == 1)
    }

    async fn ensure_user(&mut self, name: &str, role: Role, now: Millis) -> Result<Role> {
        self.execute(
            "INSERT INTO users (name, role, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
            args![name, role.as_str(), now],
        )
        .await?;
        let sql = "SELECT role FROM users WHERE name = $1";
        first(self, sql, args![name], |r| r.parsed(0, "role"))
            .await?
            .ok_or_else(|| super::super::StoreError::not_found("user", name))
    }

    async fn insert_new_user(&mut self, name: &str, role: Role, now: Millis) -> Result<bool> {
        let n = self
            .execute(
                "INSERT INTO users (name, role, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING",
                args![name, role.as_str(), now],
            )
            .await?;
        Ok(n == 1)
    }

    async fn put_user(&mut self, u: &UserView) -> Result<bool> {
        let n = self
            .execute(
                "INSERT INTO users (name, role, unix_user, allow_root, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO UPDATE SET \
                 unix_user = excluded.unix_user, allow_root = excluded.allow_root \
                 WHERE users.role = excluded.role",
                args![
                    &u.name,
                    u.role.as_str(),
                    u.unix_user.as_deref(),
                    u.allow_root,
                    u.created_at.timestamp_millis()
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn set_user_limits(&mut self, name: &str, l: &UserLimits) -> Result<()> {
        done(
            self,
            "UPDATE users SET share = $2, max_jobs = $3, max_gpus = $4, max_gpu_mib = $5 \
             WHERE name = $1",
            args![
                name,
                i64::from(l.share),
                l.max_jobs.map(i64::from),
                l.max_gpus.map(i64::from),
                opt_i64(l.max_gpu_mib)
            ],
        )
        .await
    }

    async fn users(&mut self, name: Option<&str>) -> Result<Vec<UserView>> {
        let sql = "SELECT name, role, unix_user, allow_root, created_at, share, max_jobs, \
                   max_gpus, max_gpu_mib FROM users \
                   WHERE CAST($1 AS TEXT) IS NULL OR name = $1 ORDER BY name";
        all(self, sql, args![name], |r| {
            Ok(UserView {
                name: r.text(0)?,
                role: r.parsed(1, "role")?,
                unix_user: r.text_opt(2)?,
                allow_root: r.flag(3)?,
                created_at: rows::ts(r.int(4)?),
                limits: rows::user_limits(r, 5)?,
            })
        })
        .await
    }
}
