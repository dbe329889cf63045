//! The benchmarks' Markdown tables: each column as wide as its widest cell,
//! so the text reads as a table before it is rendered.

/// `header` and `rows` as a Markdown table; the columns for which `right`
/// holds are right-aligned (`---:`), the others left-aligned.
pub(crate) fn table<const N: usize>(
    header: [&str; N],
    rows: &[[String; N]],
    right: impl Fn(usize) -> bool,
) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = header.map(str::to_owned);
    for (i, row) in std::iter::once(&header).chain(rows).enumerate() {
        out.push('|');
        for (col, (cell, w)) in row.iter().zip(widths).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            match right(col) {
                true => out.push_str(&format!(" {pad}{cell} |")),
                false => out.push_str(&format!(" {cell}{pad} |")),
            }
        }
        out.push('\n');
        if i == 0 {
            out.push('|');
            for (col, w) in widths.iter().enumerate() {
                match right(col) {
                    true => out.push_str(&format!(" {}: |", "-".repeat(w - 1))),
                    false => out.push_str(&format!(" {} |", "-".repeat(*w))),
                }
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_are_as_wide_as_their_widest_cell_and_aligned() {
        let rows = [["ladder".to_owned(), "3.5 ms".to_owned()]];
        let text = super::table(["design", "p99"], &rows, |col| col == 1);
        assert_eq!(
            text,
            "| design |    p99 |\n| ------ | -----: |\n| ladder | 3.5 ms |\n"
        );
    }
}
