//! `headroom up`: the coordinator on the embedded SQLite store and a local agent in one
//! process. The agent talks to the coordinator over HTTP like any remote agent.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use headroom_agent::agent::settings::AgentSettings;
use headroom_agent::agent::{Agent, OnExit};
use headroom_agent::gpu;
use headroom_coordinator::auth::{self, ConfigToken, Secret};
use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_coordinator::{Application, CoordinatorSettings};
use headroom_shared::api::Role;
use headroom_shared::client::BearerToken;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// `headroom up`: the coordinator's and the agent's settings, as `headroom-coordinator` and
/// `headroom-agent` take them (the same flags, variables and config-file keys).
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Submit this spec once up, show progress, and exit when every job has ended.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// A TOML file of settings (keys are the flags' names); variables and flags win over it.
    #[arg(long, env = "HEADROOM_CONFIG")]
    pub config: Option<PathBuf>,
    /// No tokens at all: every local account may submit, cancel and read everything; users
    /// cannot be mapped, and jobs run as this service's user (as `--run-as-default`, never
    /// root, when it is root). Loopback names and this machine's own programs only. By default `up` is private: it makes
    /// an admin token (`<data dir>/admin-token`, 0600) that this account's CLI and Python
    /// client find by themselves.
    #[arg(long, env = "HEADROOM_NO_AUTH")]
    pub no_auth: bool,
    #[command(flatten)]
    pub coordinator: CoordinatorSettings,
    #[command(flatten)]
    pub agent: AgentSettings,
}

/// `quiet`: only warnings by default, so a progress bar is not buried under log lines.
fn init_tracing(quiet: bool) {
    headroom_shared::logging::init(if quiet { "warn" } else { "info" });
}

/// `token`: the CLI's own (`--token`), for `--run`'s submission.
pub async fn run(args: UpArgs, token: Option<BearerToken>) -> Result<i32> {
    // First: a stop signal during start-up must stop us cleanly too.
    let shutdown = CancellationToken::new();
    headroom_shared::signals::cancel_on_stop_signal(shutdown.clone())?;
    init_tracing(args.run.is_some());
    // Refused before anything starts: the agent could not stop its jobs before their leases
    // expire.
    headroom_agent::agent::self_fence::SelfFenceBudget::new(
        args.coordinator.lease_ttl,
        args.agent.kill_grace,
    )?;
    headroom_coordinator::app::check_exposure(&args.coordinator.config(PathBuf::new())?)?;
    // The store, logs and keys are for this account alone; jobs get their own umask.
    headroom_coordinator::app::private_umask();
    // A person's own project: its `.headroom`, root or not.
    let given = args
        .coordinator
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(".headroom"));
    refuse_the_operators_token_folder(&given)?;
    let data_dir = headroom_shared::datadir::adopt(&given)?;
    // One `headroom up` per data directory: a second one would register the same node and
    // declare the first one's running jobs lost.
    let _lock = lock_data_dir(&data_dir)?;
    // Others may only pass through it, to the fake GPUs' folder their jobs write to.
    headroom_coordinator::app::private_dir(&data_dir, 0o711)?;
    keep_out_of_git(&data_dir)?;
    let gpu_choice = args.agent.backend_choice(&data_dir);
    let backend = gpu::open(&gpu_choice).context("opening the GPU backend")?;
    eprintln!("headroom: {}", backend.describe());
    if args.agent.require_doctor {
        let b = backend.clone();
        tokio::task::spawn_blocking(move || headroom_agent::doctor::gate(b.as_ref()))
            .await?
            .map_err(anyhow::Error::msg)?;
    }
    if let Some(p) = &args.agent.plan {
        headroom_shared::Plan::parse_for(p, backend.inventory().len())
            .with_context(|| format!("--plan {p:?}"))?;
    }

    let db = data_dir.join("headroom.db");
    let store = {
        let path = db.clone();
        tokio::task::spawn_blocking(move || SqliteStore::open(&path))
            .await?
            .with_context(|| format!("opening the store {}", db.display()))?
    };
    let mut config = args.coordinator.config(data_dir.clone())?;
    // Private by default: an admin token of its own, kept in the data directory, unless the
    // operator gave one (or tokens) or asked for none.
    let mut local_admin = None;
    if args.no_auth {
        if !config.tokens.is_empty() {
            anyhow::bail!("--no-auth with an admin token or a tokens file: give one or the other");
        }
        eprintln!(
            "warning: --no-auth: every local account may submit, cancel and read every job on \
             {} (from this machine only: a foreign Host or web page is refused); users cannot \
             be mapped to Unix users, and jobs run as {}",
            config.listen,
            if headroom_agent::runas::is_root() {
                format!("`{}`, never root", args.agent.run_as_default)
            } else {
                "this account".to_string()
            }
        );
    } else if args.coordinator.admin_secret()?.is_none() {
        let secret = local_admin_token(&data_dir)?;
        let mut admin = auth::admin_token(&secret)?;
        // `sudo headroom up`: the admin is the person who ran sudo, and their jobs run as them.
        admin.unix_user = sudo_user();
        if headroom_agent::runas::is_root() && admin.unix_user.is_none() {
            eprintln!(
                "warning: this `headroom up` runs as root, not through sudo: your jobs run as \
                 `{}`, which may not enter your project or read its files (a home such as \
                 /root is private). `sudo headroom up` from your own account runs them as you; \
                 where everything is root's (a container), `headroom user create admin --role \
                 admin --unix-user root --allow-root` runs them as root",
                args.agent.run_as_default
            );
        }
        config.tokens.push(admin);
        local_admin = Some(secret);
    }
    // Not root: every job runs as this account, which holds the admin token and the store.
    // One user, then: its admin (a second user's jobs could read both).
    if !headroom_agent::runas::is_root() && !args.no_auth {
        let others: Vec<&str> = config
            .tokens
            .iter()
            .filter(|t| matches!(t.role, Role::User | Role::Admin) && t.name != "admin")
            .map(|t| t.name.as_str())
            .collect();
        if !others.is_empty() {
            eprintln!(
                "warning: this `headroom up` is not root, so every job runs as this account, \
                 which holds its admin token: the configured users {} could read it through \
                 their jobs. Run `sudo headroom up` to serve several users.",
                others.join(", ")
            );
        }
        config.single_user = Some("admin".to_string());
    }
    // With tokens on, the local agent needs one of role agent: unless one was given, it gets
    // a fresh secret that lives as long as this process.
    let mut agent_token = args.agent.token()?;
    if !config.tokens.is_empty() && agent_token.is_none() {
        let secret = auth::random_secret();
        config.tokens.push(ConfigToken {
            id: None,
            name: args.agent.node_name(),
            role: Role::Agent,
            secret: Secret::Plain(secret.clone()),
            unix_user: None,
            nodes: None,
            expires_at: None,
        });
        agent_token = Some(secret.parse()?);
    }
    // `--run` submits as the CLI's token, else as the bootstrap admin.
    let submit_token = match token {
        Some(t) => Some(t),
        None => args
            .coordinator
            .admin_secret()?
            .or_else(|| local_admin.clone())
            .and_then(|t| t.parse().ok()),
    };
    let app = Application::build(config, Arc::new(store)).await?;
    let addr = app.local_addr();
    let url = format!("http://{addr}");
    // A plain line on stdout that scripts and tests can wait for.
    outln!(
        "headroom: coordinator listening on {url} (store {})",
        db.display()
    );
    // For this account's CLI and Python client, which find it by the server's address.
    let local_token = match &local_admin {
        Some(secret) => match headroom_shared::secret::write_local_token(&url, secret) {
            Ok(path) => path,
            Err(e) => {
                tracing::warn!("cannot leave the admin token for the CLI: {e}");
                None
            }
        },
        // A token an earlier `up` on this address left (killed before it could remove it)
        // is not this one's: the CLI would send it and be refused.
        None => {
            if let Some(path) = headroom_shared::secret::local_token_path(&url) {
                let _ = std::fs::remove_file(path);
            }
            None
        }
    };

    // `sudo headroom up`: the person who ran sudo, whose jobs these are, finds the token
    // too, as their own account's CLI and Python client look for it.
    let operator_token = match (&local_admin, sudo_user()) {
        (Some(secret), Some(name)) => operator_token(&url, secret, &name),
        _ => None,
    };

    // The dashboard. On a terminal, a link that logs this person in (the local admin token in
    // the fragment, which no request carries), as Jupyter prints one; elsewhere (a service's
    // log) the address alone, and where the token is.
    match &local_admin {
        Some(secret) if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
            outln!("headroom: dashboard at {url}/#token={secret}");
        }
        Some(_) => outln!(
            "headroom: dashboard at {url}/ (log in with the token in {})",
            data_dir.join("admin-token").display()
        ),
        None => outln!("headroom: dashboard at {url}/"),
    }

    let tasks = TaskTracker::new();
    let coord_stop = CancellationToken::new();
    let coordinator = tasks.spawn(app.run(coord_stop.clone()));
    let mut agent_config = args
        .agent
        .agent_config(url.clone(), data_dir.join("agent"))?;
    agent_config.token = agent_token;
    agent_config.gpu = gpu_choice;
    // The whole system is this one process: its jobs stop with it (and a `headroom up`
    // started again after a crash re-attaches to those still running).
    agent_config.on_exit = OnExit::Stop;
    let agent = Agent::new(agent_config, backend)?;
    let agent_task = tasks.spawn(agent.run(shutdown.clone()));
    tasks.close();

    let mut code = 0;
    if let Some(spec) = &args.run {
        let api = crate::client::Api::new(&url)?
            .with_token(submit_token.as_ref().map(BearerToken::expose))?;
        tokio::select! {
            r = crate::submit(&api, spec, crate::SubmitHow {
                wait: true,
                dry_run: false,
                seed: None,
                snapshot: false,
                format: crate::output::Format::Table,
            }) => {
                code = match r {
                    Ok(c) => c,
                    Err(e) => { eprintln!("error: {e:#}"); 1 }
                };
            }
            _ = shutdown.cancelled() => {}
        }
    } else {
        shutdown.cancelled().await;
    }
    tracing::info!("shutting down: stopping running attempts");
    // The agent drains first (its attempts report their end), then the coordinator stops.
    shutdown.cancel();
    if let Ok(Err(e)) = agent_task.await {
        tracing::warn!("agent: {e}");
    }
    coord_stop.cancel();
    if let Ok(Err(e)) = coordinator.await {
        tracing::warn!("coordinator: {e}");
    }
    tasks.wait().await;
    for path in local_token.into_iter().chain(operator_token) {
        let _ = std::fs::remove_file(path);
    }
    Ok(code)
}

/// The account that ran `sudo`, when this process is root through it (and that account is
/// not root).
fn sudo_user() -> Option<String> {
    if !headroom_agent::runas::is_root() {
        return None;
    }
    let name = std::env::var("SUDO_USER").ok()?;
    headroom_coordinator::auth::check_unix_user(&name, false)
        .ok()
        .map(|()| name)
}

/// Under `sudo`, the operator's `~/.headroom` is where their CLI and Python client find the
/// tokens they are given (`~/.headroom/local`, theirs): a root `up` started in their home
/// would make it its own private data directory and leave them no token. Refused, naming the
/// flag, before anything is made.
fn refuse_the_operators_token_folder(given: &std::path::Path) -> Result<()> {
    let Some(name) = sudo_user() else {
        return Ok(());
    };
    let Some(user) = nix::unistd::User::from_name(&name).ok().flatten() else {
        return Ok(());
    };
    let tokens = user.dir.join(".headroom");
    let dir = std::path::absolute(given).unwrap_or_else(|_| given.to_path_buf());
    let same = |a: &std::path::Path, b: &std::path::Path| {
        a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    };
    if same(&dir, &tokens) {
        anyhow::bail!(
            "--data-dir: {} is where `{name}`'s CLI and Python client keep the tokens they are \
             given ({}/local); a root `headroom up` cannot keep its private data there. Start \
             it from a project directory (its `.headroom` is the default) or pass --data-dir \
             elsewhere, e.g. --data-dir {}",
            dir.display(),
            tokens.display(),
            user.dir.join("headroom-data").display()
        );
    }
    Ok(())
}

/// Leaves the admin token for `name` (the account that ran `sudo`) in its home; where.
fn operator_token(url: &str, secret: &str, name: &str) -> Option<std::path::PathBuf> {
    let user = nix::unistd::User::from_name(name).ok().flatten()?;
    match headroom_shared::secret::write_local_token_for(
        url,
        secret,
        &user.dir,
        user.uid.as_raw(),
        user.gid.as_raw(),
    ) {
        Ok(Some(path)) => Some(path),
        Ok(None) => {
            tracing::warn!(
                "cannot leave the admin token for `{name}`'s CLI: {}/.headroom is not `{name}`'s \
                 own folder; give it the token in the data directory's admin-token",
                user.dir.display()
            );
            None
        }
        Err(e) => {
            tracing::warn!("cannot leave the admin token for `{name}`'s CLI: {e}");
            None
        }
    }
}

/// The admin token of this data directory (`admin-token`, 0600), made at the first start.
fn local_admin_token(dir: &std::path::Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("admin-token");
    if headroom_shared::datadir::not_a_link(&path)? {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("{}", path.display()))?;
        return Ok(headroom_shared::secret::read_file(&path, "admin token")?);
    }
    let secret = auth::random_secret();
    headroom_shared::secret::write_private(&path, &format!("{secret}\n"))
        .with_context(|| format!("creating {}", path.display()))?;
    Ok(secret)
}

/// A `.gitignore` of `*` in the data directory, as a venv has: a `.headroom` in a project's
/// checkout (the default) is never committed with it, its admin token included. One the
/// user wrote is left as it is.
fn keep_out_of_git(dir: &std::path::Path) -> Result<()> {
    let path = dir.join(".gitignore");
    // `create_new` follows no link: a planted one is left alone, not written through.
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut file) => std::io::Write::write_all(&mut file, b"# made by headroom up\n*\n")
            .with_context(|| format!("writing {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// Holds an exclusive lock on `<data dir>/lock` for the life of the process.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File> {
    let path = dir.join("lock");
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another `headroom up` is using the data dir {} (stop it, or pass --data-dir)",
            dir.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}
