//! The command line with `headroom up`'s config file: defaults, then the TOML file
//! (`--config` or `HEADROOM_CONFIG`), then `HEADROOM_*` variables, then flags. The layering is
//! the one every binary uses (`headroom_shared::settings`); the keys are the coordinator's and
//! the agent's settings, as `headroom-coordinator` and `headroom-agent` take them.

use anyhow::Result;
pub use headroom_shared::settings::Parsed;

use crate::Cli;

/// Parses the process's command line (help, version and usage errors exit as clap does).
pub fn parse_args() -> Result<Cli> {
    Ok(headroom_shared::settings::parse()?)
}

/// `parse_args` for `headroom`: `up` and `doctor` are checked and named, their config file
/// left for `headroom-node` to read (once: it may be a pipe).
pub fn parse_client_args() -> Result<Parsed<Cli>> {
    Ok(headroom_shared::settings::parse_or_hand_over(
        crate::NODE_COMMANDS,
    )?)
}

#[cfg(test)]
mod tests {
    use crate::{Cli, Command};

    fn up_with(file: &str, argv: &[&str]) -> anyhow::Result<crate::up::UpArgs> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("headroom.toml");
        std::fs::write(&path, file)?;
        let mut full = vec![
            "headroom",
            "up",
            "--config",
            path.to_str().unwrap_or_default(),
        ];
        full.extend_from_slice(argv);
        let cli: Cli = headroom_shared::settings::parse_from(full)?;
        let Command::Up(args) = cli.command else {
            anyhow::bail!("not up")
        };
        Ok(*args)
    }

    #[test]
    fn file_fills_defaults_and_flags_win() -> anyhow::Result<()> {
        let args = up_with(
            "plan = \"2,2,1\"\nfake-gpus = \"3x12GiB\"\nkill_grace = \"2s\"\nlease-ttl = \"9s\"\n\
             max_jobs = 7\nkill_foreign = true\n",
            &["--plan", "1,1,1"],
        )?;
        assert_eq!(args.agent.plan.as_deref(), Some("1,1,1"));
        assert_eq!(args.agent.fake_gpus.to_string(), "3x12GiB");
        assert_eq!(args.agent.kill_grace, std::time::Duration::from_secs(2));
        assert!(args.agent.kill_foreign);
        assert_eq!(
            args.coordinator.lease_ttl,
            std::time::Duration::from_secs(9)
        );
        assert_eq!(args.coordinator.max_jobs, 7);
        Ok(())
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let err = up_with("plna = \"2,2\"\n", &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("unknown key `plna`"), "{err}");
        let err = up_with("headroom = \"lots\"\n", &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--headroom") && err.contains("lots"), "{err}");
        // The CLI's own `--server` is no setting of `up`.
        let err = up_with("server = \"http://x\"\n", &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("unknown key `server`"), "{err}");
    }
}
