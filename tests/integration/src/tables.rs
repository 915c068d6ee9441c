//! Tables the CLI prints, read back for assertions.

/// The rows of a CSV export as (header, rows of cells).
pub fn csv_table(csv: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_reader(csv.as_bytes());
    let header = r
        .headers()
        .expect("header")
        .iter()
        .map(str::to_string)
        .collect();
    let rows = r
        .records()
        .map(|rec| rec.expect("row").iter().map(str::to_string).collect())
        .collect();
    (header, rows)
}
