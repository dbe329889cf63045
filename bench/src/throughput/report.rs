//! The table the benchmark prints and the JSON it writes: each figure next to its
//! baseline, the ratio measured in the same rounds, and the target: the limit
//! of the row's goal in [`goals::GOALS`].

use serde_json::{Value, json};

use crate::goals::{self, Bench, Limit, Measurement, number};
use crate::median;

/// One line of the table.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) figure: String,
    pub(super) unit: &'static str,
    /// Per round (or one value), the baseline.
    pub(super) baseline: Vec<f64>,
    /// Per round, order-expiry.
    pub(super) ours: Vec<f64>,
    /// The measure of the goal this row is judged by ([`goals::GOALS`],
    /// throughput); `None`: shown for information.
    pub(super) goal: Option<String>,
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

    /// What the goal judges: the ratio to the baseline when the row has one,
    /// else the median of ours.
    pub(super) fn judged(&self) -> Option<f64> {
        if self.baseline.is_empty() {
            (!self.ours.is_empty()).then(|| median(&self.ours))
        } else {
            self.ratio()
        }
    }

    fn limit(&self) -> Option<Limit> {
        goals::limit(Bench::Throughput, self.goal.as_deref()?)
    }

    /// Whether the goal is met; `None` without a goal.
    pub(super) fn met(&self) -> Option<bool> {
        let limit = self.limit()?;
        Some(self.judged().is_some_and(|v| limit.met(v)))
    }

    fn target_text(&self) -> String {
        match self.limit() {
            None => String::new(),
            Some(limit) if !self.baseline.is_empty() => format!("ratio {limit}"),
            Some(limit) => limit.to_string(),
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
    crate::markdown::table(header, &cells, |col| (2..=4).contains(&col))
}

/// The rows with a goal, as measurements of it.
pub(super) fn measurements(rows: &[Row]) -> Vec<Measurement> {
    rows.iter()
        .filter_map(|r| Some(Measurement::new(r.goal.clone()?, r.judged()?)))
        .collect()
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

    fn row(goal: Option<&str>, baseline: Vec<f64>, ours: Vec<f64>) -> Row {
        Row {
            figure: "x".into(),
            unit: "msg/s",
            baseline,
            ours,
            goal: goal.map(str::to_owned),
            note: String::new(),
        }
    }

    #[test]
    fn ratios_are_medians_of_same_round_ratios() {
        let row = row(
            Some("end to end, quorum: ratio to bare lapin"),
            vec![100.0, 200.0, 100.0],
            vec![90.0, 100.0, 80.0],
        );
        assert_eq!(row.ratio(), Some(0.8));
        assert_eq!(row.met(), Some(true));
        let text = table(&[row]);
        assert!(text.contains("| ratio >= 0.80 | yes |"), "{text}");
    }

    #[test]
    fn rows_are_judged_by_their_goal_in_the_goals_table() {
        let drain = row(Some("drain: ratio to bare lapin"), vec![100.0], vec![69.0]);
        assert_eq!(drain.met(), Some(false), "drain's goal is 0.7");
        let rss = row(Some("consumer peak RSS while draining"), vec![], vec![20.3]);
        assert_eq!((rss.judged(), rss.met()), (Some(20.3), Some(true)));
        let unmeasured = row(Some("publisher RSS growth, quorum"), vec![], vec![]);
        assert_eq!(unmeasured.met(), Some(false));
        let info = row(None, vec![1.0], vec![2.0]);
        assert_eq!(info.met(), None);
        let text = table(&[drain.clone(), rss.clone(), info.clone()]);
        assert!(text.contains("| ratio >= 0.70 | NO  |"), "{text}");
        assert!(text.contains("| <= 64 "), "{text}");
        assert_eq!(
            measurements(&[drain, rss, unmeasured, info]),
            [
                Measurement::new("drain: ratio to bare lapin", 0.69),
                Measurement::new("consumer peak RSS while draining", 20.3),
            ]
        );
    }
}
