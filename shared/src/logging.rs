//! Every binary's log lines, set up once: the level from `HEADROOM_LOG` (an `EnvFilter`:
//! `info`, `headroom=debug,warn`), the format from `HEADROOM_LOG_FORMAT` (`text`, the
//! default, or `json`: one object a line, for `kubectl logs`, Loki or journald), on
//! standard error, with colour only when that is a terminal (never in a file or a pipe).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Where the format is read.
pub const FORMAT_VAR: &str = "HEADROOM_LOG_FORMAT";

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" | "" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(format!("{FORMAT_VAR}: `{other}` is not `text` or `json`")),
        }
    }
}

/// Installs the subscriber for the process (a second call does nothing). `default` is the
/// filter when `HEADROOM_LOG` is unset or not valid; an unknown format is said on standard
/// error and text is used.
pub fn init(default: &str) {
    let filter =
        EnvFilter::try_from_env("HEADROOM_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let format = std::env::var(FORMAT_VAR)
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|e: String| {
            eprintln!("{e}; writing text");
            Format::Text
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        Format::Json => builder.json().with_current_span(true).try_init(),
        Format::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::Format;

    #[test]
    fn the_format_is_text_or_json_and_anything_else_is_named() {
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert_eq!("".parse::<Format>(), Ok(Format::Text));
        let e = "yaml".parse::<Format>().expect_err("refused");
        assert!(
            e.contains("HEADROOM_LOG_FORMAT") && e.contains("yaml"),
            "{e}"
        );
    }
}
