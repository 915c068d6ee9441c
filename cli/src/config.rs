//! The `headroom up` config file: a TOML file whose keys are the flags' long names. Order of
//! precedence: defaults, then the file, then `HEADROOM_*` variables, then flags.

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::ArgMatches;
use clap::parser::ValueSource;

use crate::up::UpArgs;

/// Keys a config file may set (the long flag names, `-` or `_`).
const KEYS: &[&str] = &[
    "listen",
    "data_dir",
    "node",
    "plan",
    "headroom",
    "gpu_backend",
    "fake_gpus",
    "kill_grace",
    "verify_timeout",
    "lease_ttl",
    "max_jobs",
    "kill_foreign",
];

/// Applies the file's values to every setting that neither a flag nor a variable gave.
pub fn apply_file(args: &mut UpArgs, matches: &ArgMatches, file: &Path) -> Result<()> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading config {}", file.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("config {} is not valid TOML", file.display()))?;
    for (raw_key, value) in table {
        let key = raw_key.replace('-', "_");
        if !KEYS.contains(&key.as_str()) {
            bail!(
                "config {}: unknown key `{raw_key}` (known: {})",
                file.display(),
                KEYS.join(", ")
            );
        }
        let given = matches!(
            matches.value_source(&key),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if given {
            continue;
        }
        let text = match &value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => bail!(
                "config {}: `{raw_key}` must be a string, a number or a boolean, not {other}",
                file.display()
            ),
        };
        let bad = |e: String| anyhow::anyhow!("config {}: `{raw_key}`: {e}", file.display());
        match key.as_str() {
            "listen" => args.listen = text.parse().map_err(|e| bad(format!("{e}")))?,
            "data_dir" => args.data_dir = text.into(),
            "node" => args.node = Some(text),
            "plan" => args.plan = Some(text),
            "headroom" => args.headroom = text.parse().map_err(|e| bad(format!("{e}")))?,
            "gpu_backend" => {
                args.gpu_backend = clap::ValueEnum::from_str(&text, true).map_err(bad)?;
            }
            "fake_gpus" => args.fake_gpus = text.parse().map_err(|e| bad(format!("{e}")))?,
            "kill_grace" => {
                args.kill_grace =
                    humantime::parse_duration(&text).map_err(|e| bad(e.to_string()))?
            }
            "lease_ttl" => {
                args.lease_ttl = humantime::parse_duration(&text).map_err(|e| bad(e.to_string()))?
            }
            "kill_foreign" => args.kill_foreign = text.parse().map_err(|e| bad(format!("{e}")))?,
            "max_jobs" => args.max_jobs = text.parse().map_err(|e| bad(format!("{e}")))?,
            _ => unreachable!("checked against KEYS"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

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
        let matches = Cli::command().try_get_matches_from(full)?;
        let cli = Cli::from_arg_matches(&matches)?;
        let Command::Up(mut args) = cli.command else {
            anyhow::bail!("not up")
        };
        let sub = matches
            .subcommand_matches("up")
            .ok_or_else(|| anyhow::anyhow!("no up"))?;
        super::apply_file(&mut args, sub, &path)?;
        Ok(*args)
    }

    #[test]
    fn file_fills_defaults_and_flags_win() -> anyhow::Result<()> {
        let args = up_with(
            "plan = \"2,2,1\"\nfake-gpus = \"3x12GiB\"\nkill_grace = \"2s\"\n",
            &["--plan", "1,1,1"],
        )?;
        assert_eq!(args.plan.as_deref(), Some("1,1,1"));
        assert_eq!(args.fake_gpus.to_string(), "3x12GiB");
        assert_eq!(args.kill_grace, std::time::Duration::from_secs(2));
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
        assert!(err.contains("`headroom`"), "{err}");
    }
}
