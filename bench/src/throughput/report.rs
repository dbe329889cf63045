//! The table the benchmark prints and the JSON it writes: each figure next to its
//! baseline, the ratio measured in the same rounds, and the target.

use serde_json::{Value, json};

/// Median; 0 for none.
pub(super) fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// How a ratio is judged.
#[derive(Debug, Clone, Copy)]
pub(super) enum Target {
    /// ours / baseline must be at least this.
    RatioAtLeast(f64),
    /// The value must be at most this.
    AtMost(f64),
    /// Shown for information.
    None,
}

/// One line of the table.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) figure: String,
    pub(super) unit: &'static str,
    /// Per round (or one value), the baseline.
    pub(super) baseline: Vec<f64>,
    /// Per round, order-expiry.
    pub(super) ours: Vec<f64>,
    pub(super) target: Target,
    /// Free text: what the baseline is.
    pub(super) note: String,
}

impl Row {
    /// The median over rounds of ours / baseline, each round's pair measured back
    /// to back.
    pub(super) fn ratio(&self) -> Option<f64> {
        if self.baseline.is_empty() || self.baseline.len() != self.ours.len() {
            return None;
        }
        let ratios: Vec<f64> = self
            .ours
            .iter()
            .zip(&self.baseline)
            .filter(|(_, b)| **b > 0.0)
            .map(|(o, b)| o / b)
            .collect();
        Some(median(&ratios))
    }

    /// Whether the target is met; `None` without a target.
    pub(super) fn met(&self) -> Option<bool> {
        match self.target {
            Target::RatioAtLeast(min) => self.ratio().map(|r| r >= min),
            Target::AtMost(max) => Some(median(&self.ours) <= max),
            Target::None => None,
        }
    }

    fn target_text(&self) -> String {
        match self.target {
            Target::RatioAtLeast(min) => format!("ratio >= {min}"),
            Target::AtMost(max) => format!("<= {}", number(max)),
            Target::None => String::new(),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "figure": self.figure,
            "unit": self.unit,
            "baseline": if self.baseline.is_empty() { Value::Null } else { json!(median(&self.baseline)) },
            "value": median(&self.ours),
            "ratio": self.ratio(),
            "target": self.target_text(),
            "met": self.met(),
            "baseline_rounds": self.baseline,
            "value_rounds": self.ours,
            "note": self.note,
        })
    }
}

/// A readable number: no decimals when large.
fn number(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The text table.
pub(super) fn table(rows: &[Row]) -> String {
    let header = [
        "figure",
        "unit",
        "baseline",
        "order-expiry",
        "ratio",
        "target",
        "met",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.figure.clone(),
                r.unit.to_owned(),
                if r.baseline.is_empty() {
                    "-".to_owned()
                } else {
                    number(median(&r.baseline))
                },
                number(median(&r.ours)),
                r.ratio().map_or("-".to_owned(), |x| format!("{x:.2}")),
                r.target_text(),
                match r.met() {
                    Some(true) => "yes".to_owned(),
                    Some(false) => "NO".to_owned(),
                    None => String::new(),
                },
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |row: &[String]| {
        let mut out = String::from("|");
        for (i, (c, w)) in row.iter().zip(widths).enumerate() {
            let pad = w - c.chars().count();
            if (2..=4).contains(&i) {
                out.push_str(&format!(" {}{c} |", " ".repeat(pad)));
            } else {
                out.push_str(&format!(" {c}{} |", " ".repeat(pad)));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(&header.map(str::to_owned));
    out.push('|');
    for (i, w) in widths.iter().enumerate() {
        let dashes = "-".repeat(*w);
        if (2..=4).contains(&i) {
            out.push_str(&format!(" {dashes}:|"));
        } else {
            out.push_str(&format!(" {dashes} |"));
        }
    }
    out.push('\n');
    for row in &cells {
        out.push_str(&line(row));
    }
    out
}

/// Everything, for `throughput.json`.
pub(super) fn to_json(rows: &[Row], context: Value, extra: Value) -> Value {
    json!({
        "context": context,
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "details": extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_same_round_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        let row = Row {
            figure: "x".into(),
            unit: "msg/s",
            baseline: vec![100.0, 200.0, 100.0],
            ours: vec![90.0, 100.0, 80.0],
            target: Target::RatioAtLeast(0.8),
            note: String::new(),
        };
        assert_eq!(row.ratio(), Some(0.8));
        assert_eq!(row.met(), Some(true));
        assert!(table(&[row]).contains("| yes |"));
    }
}
