//! The aggregate's section of the page (a Table A1-style table with each run's row beneath).

use hyperlens_model::Task;

use crate::aggregate::text::stat_text;
use crate::data::{Aggregate, Group};
use crate::doc::{Document, FigureRef};
use crate::words::md_escape;

/// The aggregate section of the page: per task a Table A1-style table of the groups (mean ± s.e.
/// and n), each run's own row, and the figures.
pub fn section(doc: &mut Document, agg: &Aggregate, figs: &[FigureRef]) {
    doc.heading(2, "Aggregate over seeds");
    doc.paragraph("Runs that differ only in their seed (and split) form a group; each cell is the mean ± standard error over the group's runs, with their number in brackets. The table is `aggregate.csv`; every run's own numbers follow, so that one stalled seed stays visible.");
    for (task, _) in &agg.axes {
        let groups: Vec<&Group> = agg.groups.iter().filter(|g| g.task == *task).collect();
        let logic = *task == Task::Logic;
        let (cols, best): (Vec<(&str, &str)>, &str) = if logic {
            (
                vec![
                    ("ID R²", "id_r2"),
                    ("OOD R²", "ood_r2"),
                    ("unknown-term R²", "unknown_r2"),
                ],
                "term_f1_all",
            )
        } else {
            (
                vec![("ID acc", "id_acc"), ("OOD acc", "ood_acc")],
                "decoding_all",
            )
        };
        let mut header = vec!["group".to_string(), "runs".to_string()];
        header.extend(cols.iter().map(|(h, _)| h.to_string()));
        header.push(if logic {
            "term F1, all layers".into()
        } else {
            "rule decoding, all layers".into()
        });
        let rows = groups
            .iter()
            .map(|g| {
                let mut r = vec![md_escape(&g.label), g.runs.len().to_string()];
                r.extend(cols.iter().map(|(_, m)| stat_text(g.stat(m), !logic)));
                r.push(stat_text(g.stat(best), !logic));
                r
            })
            .collect();
        doc.paragraph(format!(
            "**{}.**",
            if logic { "Fuzzy-logic task" } else { "SRAVEN" }
        ));
        doc.table(header, rows);
        let mut header = vec!["run".to_string(), "group".to_string(), "seed".to_string()];
        header.extend(cols.iter().map(|(h, _)| h.to_string()));
        let rows = groups
            .iter()
            .flat_map(|g| g.runs.iter().map(move |&i| (g, &agg.points[i])))
            .map(|(g, p)| {
                let mut r = vec![
                    md_escape(&p.name),
                    md_escape(&g.label),
                    p.seed.map_or("-".into(), |s| s.to_string()),
                ];
                r.extend(cols.iter().map(|(_, m)| {
                    p.metrics
                        .iter()
                        .find(|(n, _)| n == m)
                        .map_or("-".into(), |(_, v)| {
                            if logic {
                                format!("{v:.3}")
                            } else {
                                format!("{:.1} %", 100.0 * v)
                            }
                        })
                }));
                r
            })
            .collect();
        doc.table(header, rows);
        for f in figs
            .iter()
            .filter(|f| f.src.contains(&format!("aggregate_{task}_")))
        {
            doc.figure(f.clone());
        }
    }
}
