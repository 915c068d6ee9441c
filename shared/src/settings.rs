//! Settings layering for every binary (feature `settings`): defaults, then a TOML file
//! (`--config FILE` or `HEADROOM_CONFIG`), then `HEADROOM_*` variables, then flags. The file's
//! keys are the flags' long names (`kill-grace` or `kill_grace`); an unknown key is refused by
//! name. The file is read once, at start, by the same clap parser that reads the flags, so a
//! value means the same (and is checked the same) wherever it comes from.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Command, CommandFactory, FromArgMatches};

/// The argument naming the config file, in every binary that takes one.
pub const CONFIG_ARG: &str = "config";

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {} is not valid TOML: {message}", path.display())]
    Toml { path: PathBuf, message: String },
    #[error("config {}: unknown key `{key}` (known: {known})", path.display())]
    UnknownKey {
        path: PathBuf,
        key: String,
        known: String,
    },
    #[error("config {}: `{key}`: {message}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("config {}: {source}", path.display())]
    Invalid { path: PathBuf, source: clap::Error },
    #[error(transparent)]
    Args(#[from] clap::Error),
}

/// A duration as people write it (`10s`, `500ms`, `2m`), for `value_parser`.
pub fn duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration like `10s` or `500ms`: {e}"))
}

/// `C::parse()` with the config file laid under variables and flags. Help, version and
/// command-line mistakes print and exit as clap does; file mistakes are returned.
pub fn parse<C: CommandFactory + FromArgMatches>() -> Result<C, SettingsError> {
    match parse_from(std::env::args_os()) {
        Err(SettingsError::Args(e)) => e.exit(),
        other => other,
    }
}

/// What [`parse_or_hand_over`] found: the command, or the name of a subcommand that another
/// program parses whole.
#[derive(Debug)]
pub enum Parsed<C> {
    Command(C),
    HandOver(String),
}

/// `parse`, except that a command line whose subcommand is one of `hand_over` is only
/// checked (its flags, not its config file) and named: the program hands the command line
/// to another that reads the file, once (it may be a pipe).
pub fn parse_or_hand_over<C: CommandFactory + FromArgMatches>(
    hand_over: &[&str],
) -> Result<Parsed<C>, SettingsError> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let mut cmd = C::command();
    let matches = cmd
        .try_get_matches_from_mut(&argv)
        .unwrap_or_else(|e| e.exit());
    if let Some((name, _)) = matches.subcommand()
        && hand_over.contains(&name)
    {
        return Ok(Parsed::HandOver(name.to_string()));
    }
    match with_file(cmd, &matches, argv) {
        Err(SettingsError::Args(e)) => e.exit(),
        other => other.map(Parsed::Command),
    }
}

/// `parse` over an explicit command line (the first item is the program name).
pub fn parse_from<C, I, T>(argv: I) -> Result<C, SettingsError>
where
    C: CommandFactory + FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    // Built once: the whole tree of commands and their arguments is most of a parse's cost.
    let mut cmd = C::command();
    let matches = cmd.try_get_matches_from_mut(&argv)?;
    with_file(cmd, &matches, argv)
}

/// The command line's `matches`, with the config file it names (if any) laid under them.
fn with_file<C: FromArgMatches>(
    mut cmd: Command,
    matches: &ArgMatches,
    argv: Vec<OsString>,
) -> Result<C, SettingsError> {
    let (leaf_cmd, leaf) = leaf(&cmd, matches);
    let Some(path) = leaf
        .try_get_one::<PathBuf>(CONFIG_ARG)
        .ok()
        .flatten()
        .cloned()
    else {
        return Ok(C::from_arg_matches(matches)?);
    };
    let extra = file_args(leaf_cmd, leaf, &path)?;
    if extra.is_empty() {
        return Ok(C::from_arg_matches(matches)?);
    }
    // Flags of the file go after the command line's: they belong to the innermost
    // subcommand, and only settings that neither a flag nor a variable gave are added.
    let full: Vec<OsString> = argv.into_iter().chain(extra).collect();
    let matches = cmd
        .try_get_matches_from_mut(&full)
        .map_err(|source| SettingsError::Invalid {
            path: path.clone(),
            source,
        })?;
    Ok(C::from_arg_matches(&matches)?)
}

/// The innermost subcommand that was given, with its matches.
fn leaf<'a>(cmd: &'a Command, matches: &'a ArgMatches) -> (&'a Command, &'a ArgMatches) {
    match matches.subcommand() {
        Some((name, sub)) => match cmd.find_subcommand(name) {
            Some(sub_cmd) => leaf(sub_cmd, sub),
            None => (cmd, matches),
        },
        None => (cmd, matches),
    }
}

/// The file's settings as flags, for the settings no flag or variable gave.
fn file_args(
    cmd: &Command,
    matches: &ArgMatches,
    path: &Path,
) -> Result<Vec<OsString>, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| SettingsError::Toml {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    // A global flag (the CLI's `--server`) belongs to the command line, not to a
    // subcommand's file; the parsed tree holds it in every subcommand.
    let settable = |a: &&clap::Arg| {
        a.get_long().is_some()
            && !a.is_global_set()
            && a.get_id() != CONFIG_ARG
            && !matches!(a.get_id().as_str(), "help" | "version")
    };
    let mut out = Vec::new();
    for (key, value) in table {
        let id = key.replace('-', "_");
        let Some(arg) = cmd
            .get_arguments()
            .filter(settable)
            .find(|a| a.get_id() == id.as_str())
        else {
            let known: Vec<String> = cmd
                .get_arguments()
                .filter(settable)
                .filter_map(|a| a.get_long().map(str::to_string))
                .collect();
            return Err(SettingsError::UnknownKey {
                path: path.to_path_buf(),
                key,
                known: known.join(", "),
            });
        };
        if matches!(
            matches.value_source(&id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let bad = |message: String| SettingsError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
            message,
        };
        let text = match &value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(bad(format!(
                    "must be a string, a number or a boolean, not {}",
                    other.type_str()
                )));
            }
        };
        let long = arg.get_long().unwrap_or(arg.get_id().as_str());
        if arg.get_action().takes_values() {
            out.push(OsString::from(format!("--{long}={text}")));
        } else {
            // A switch (`kill_foreign = true`).
            match value.as_bool() {
                Some(true) => out.push(OsString::from(format!("--{long}"))),
                Some(false) => {}
                None => return Err(bad(format!("a switch: write true or false, not `{text}`"))),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::{Args, Parser, Subcommand};

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[arg(long, global = true, default_value = "g")]
        server: String,
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(Subcommand, Debug)]
    enum Sub {
        Up(Up),
    }

    #[derive(Args, Debug)]
    struct Up {
        #[arg(long, default_value = "one")]
        plan: String,
        #[arg(long, env = "HEADROOM_SETTINGS_TEST_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
        kill_grace: Duration,
        #[arg(long)]
        kill_foreign: bool,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        config: Option<PathBuf>,
    }

    fn up(file: &str, args: &[&str]) -> Result<Up, SettingsError> {
        let dir = tempfile::tempdir().map_err(|source| SettingsError::Read {
            path: PathBuf::new(),
            source,
        })?;
        let path = dir.path().join("h.toml");
        std::fs::write(&path, file).map_err(|source| SettingsError::Read {
            path: path.clone(),
            source,
        })?;
        let mut argv = vec![
            "headroom",
            "up",
            "--config",
            path.to_str().unwrap_or_default(),
        ];
        argv.extend_from_slice(args);
        let cli: Cli = parse_from(argv)?;
        let Sub::Up(up) = cli.cmd;
        Ok(up)
    }

    #[test]
    fn file_fills_what_flags_leave_and_flags_win() {
        let u = up(
            "plan = \"2,2\"\nkill-grace = \"3s\"\nkill_foreign = true\nnode = \"n1\"\n",
            &["--node", "n2"],
        )
        .expect("parses");
        assert_eq!(u.plan, "2,2");
        assert_eq!(u.kill_grace, Duration::from_secs(3));
        assert!(u.kill_foreign);
        assert_eq!(u.node.as_deref(), Some("n2"));
    }

    #[test]
    fn unknown_keys_bad_values_and_globals_are_refused_by_name() {
        let e = up("plna = \"2\"\n", &[])
            .expect_err("unknown key")
            .to_string();
        assert!(
            e.contains("unknown key `plna`") && e.contains("kill-grace"),
            "{e}"
        );
        let e = up("kill_grace = \"soon\"\n", &[])
            .expect_err("bad value")
            .to_string();
        assert!(e.contains("soon") && e.contains("kill-grace"), "{e}");
        let e = up("kill_foreign = \"yes\"\n", &[])
            .expect_err("bad switch")
            .to_string();
        assert!(e.contains("`kill_foreign`"), "{e}");
        let e = up("plan = [1, 2]\n", &[]).expect_err("array").to_string();
        assert!(e.contains("`plan`"), "{e}");
        let e = up("config = \"x\"\n", &[])
            .expect_err("config in config")
            .to_string();
        assert!(e.contains("unknown key `config`"), "{e}");
        // A global flag is the command line's, though the parsed tree holds it in `up`.
        let e = up("server = \"x\"\n", &[])
            .expect_err("global in config")
            .to_string();
        assert!(e.contains("unknown key `server`"), "{e}");
    }
}
