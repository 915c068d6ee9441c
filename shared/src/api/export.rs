//! The export's query and its JSON page: one row per attempt, its columns described.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct ExportQuery {
    /// Only this experiment's (its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(value_type = Option<crate::ids::ExperimentId>))]
    pub experiment: Option<String>,
    /// Leave out attempts that are contaminated or were throttled (thermal or power), or
    /// whose throttling could not be read although they ran on GPUs; failed attempts stay.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clean_only: bool,
    /// `csv` (the default: one file, every row) or `json` (pages of `limit` rows).
    #[serde(default, skip_serializing_if = "ExportFormat::is_csv")]
    #[cfg_attr(feature = "openapi", param(inline))]
    pub format: ExportFormat,
    /// Rows after this many (the `next_after` of the previous JSON page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// At most this many rows (JSON: by default and at most 10000; CSV: all by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    #[default]
    Csv,
    Json,
}

impl ExportFormat {
    fn is_csv(&self) -> bool {
        *self == ExportFormat::Csv
    }
}

/// What an export column holds: the JSON value's type, and a frame's dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    String,
    Integer,
    Number,
    Boolean,
    /// RFC 3339 text.
    Time,
    /// A list of integers (`gpus`; `;`-joined in CSV).
    List,
}

/// One column of the export, as the CSV header names it and the JSON rows key it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportColumn {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ColumnType,
    /// The unit of a figure (`J`, `W`, `MiB`, `ms`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    pub description: String,
    /// Whether `clean_only` reads the column (the attempt is left out on its value).
    #[serde(default)]
    pub decides_clean: bool,
    /// Whether it is a figure of the run to compare runs by (what the dashboard plots
    /// against a parameter).
    #[serde(default)]
    pub figure: bool,
}

/// `GET /v1/export?format=json`: a page of rows, each keyed by the columns' names and with
/// `params`, the parameters the attempt ran with.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportPage {
    pub columns: Vec<ExportColumn>,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub rows: Vec<serde_json::Map<String, Value>>,
    /// Pass as `after` for the next page; `None`: this was the last.
    pub next_after: Option<u64>,
}
