//! A small document model for the report page: headings, paragraphs, tables, figures and a table
//! of contents, rendered to Markdown here (`index.md`) and to HTML in [`crate::html`]
//! (`index.html`). Paragraph text and table cells are CommonMark inline text (`**bold**`,
//! `` `code` ``); text the report did not write must go through [`crate::words::md_escape`].

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// One block of the page.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    /// A heading of level 1-3, with the anchor id that links to it.
    Heading {
        /// 1 (page title), 2 (section) or 3.
        level: u8,
        /// Plain text.
        text: String,
        /// Anchor, unique in the document ([`slug`] of the text, GitHub's rule).
        id: String,
    },
    /// A paragraph of inline Markdown.
    Paragraph(String),
    /// A table with a header row.
    Table(Table),
    /// A figure with its caption and sentences.
    Figure(FigureRef),
    /// The table of contents: in Markdown a list of the sections; in HTML a sidebar that also
    /// lists every figure.
    Contents,
}

/// A table: header and rows of inline Markdown cells (every row as long as the header).
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Column titles.
    pub header: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

/// A figure of the page: a PNG beside the page, its caption and the sentences generated from its
/// numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureRef {
    /// Anchor of the figure in the HTML page.
    pub id: String,
    /// Short name in the table of contents (`PCA by rule`).
    pub short: String,
    /// Caption, plain text without a final full stop.
    pub caption: String,
    /// One or two sentences of inline Markdown.
    pub text: String,
    /// Path of the PNG relative to the page.
    pub src: String,
    /// Width of the PNG in pixels (narrow figures sit side by side in the HTML page).
    pub width: u32,
    /// The interactive SVG that the HTML page shows in place of the PNG (the PNG is its
    /// fallback); `index.md` always shows the PNG.
    pub interactive: Option<Interactive>,
}

/// An interactive figure of the HTML page: a standalone SVG file written by `hyperlens-viz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interactive {
    /// Path of the SVG relative to the page.
    pub path: String,
    /// Its canvas, `(width, height)` in CSS pixels (the page keeps its aspect ratio).
    pub size: (u32, u32),
    /// What the reader can do, after "Interactive: " under the figure, e.g. "hover for values".
    pub hint: String,
}

/// A document: blocks in order; headings get unique anchors as they are added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Document {
    /// The blocks, in order.
    pub blocks: Vec<Block>,
    ids: BTreeSet<String>,
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, only alphanumerics, `-` and `_` kept.
pub fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

impl Document {
    /// An empty document.
    pub fn new() -> Self {
        Self::default()
    }

    /// A unique anchor for `base`: `base`, else `base-1`, `base-2`, ... (GitHub's rule for
    /// repeated headings).
    pub fn unique_id(&mut self, base: &str) -> String {
        let mut id = base.to_string();
        let mut k = 0;
        while self.ids.contains(&id) {
            k += 1;
            id = format!("{base}-{k}");
        }
        self.ids.insert(id.clone());
        id
    }

    /// Adds a heading and returns its anchor.
    pub fn heading(&mut self, level: u8, text: &str) -> String {
        let id = self.unique_id(&slug(text));
        self.blocks.push(Block::Heading {
            level: level.clamp(1, 3),
            text: text.to_string(),
            id: id.clone(),
        });
        id
    }

    /// Adds a paragraph of inline Markdown.
    pub fn paragraph(&mut self, text: impl Into<String>) {
        self.blocks.push(Block::Paragraph(text.into()));
    }

    /// Adds a table.
    pub fn table(&mut self, header: Vec<String>, rows: Vec<Vec<String>>) {
        self.blocks.push(Block::Table(Table { header, rows }));
    }

    /// Adds a figure.
    pub fn figure(&mut self, fig: FigureRef) {
        self.blocks.push(Block::Figure(fig));
    }

    /// Adds the table of contents at this place.
    pub fn contents(&mut self) {
        self.blocks.push(Block::Contents);
    }

    /// The sections (level-2 headings) with their anchors, and under each the figures it holds.
    pub fn sections(&self) -> Vec<(&str, &str, Vec<&FigureRef>)> {
        let mut out: Vec<(&str, &str, Vec<&FigureRef>)> = Vec::new();
        for b in &self.blocks {
            match b {
                Block::Heading {
                    level: 2, text, id, ..
                } => out.push((text, id, Vec::new())),
                Block::Figure(f) => {
                    if let Some(last) = out.last_mut() {
                        last.2.push(f);
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The Markdown text (`index.md`).
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        for b in &self.blocks {
            if !md.is_empty() {
                md.push('\n');
            }
            match b {
                Block::Heading { level, text, .. } => {
                    let _ = writeln!(md, "{} {text}", "#".repeat(usize::from(*level)));
                }
                Block::Paragraph(text) => {
                    let _ = writeln!(md, "{text}");
                }
                Block::Table(t) => md.push_str(&table_markdown(t)),
                Block::Figure(f) => {
                    let _ = writeln!(
                        md,
                        "**{}.** {}\n\n![{}]({})",
                        f.caption, f.text, f.caption, f.src
                    );
                }
                Block::Contents => {
                    for (text, id, _) in self.sections() {
                        let _ = writeln!(md, "- [{text}](#{id})");
                    }
                }
            }
        }
        md
    }
}

/// A table as a GitHub-flavoured Markdown table.
pub fn table_markdown(t: &Table) -> String {
    let mut md = String::new();
    let row = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    md.push_str(&row(&t.header));
    let _ = writeln!(md, "|{}", "---|".repeat(t.header.len()));
    for r in &t.rows {
        md.push_str(&row(r));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_and_ids_follow_github() {
        assert_eq!(slug("paper-jax-hyla-seed2"), "paper-jax-hyla-seed2");
        assert_eq!(slug("Against the paper"), "against-the-paper");
        assert_eq!(slug("ID & OOD (all)"), "id--ood-all");
        let mut d = Document::new();
        assert_eq!(d.heading(2, "Summary"), "summary");
        assert_eq!(d.heading(2, "Summary"), "summary-1");
        assert_eq!(d.unique_id("summary"), "summary-2");
    }

    #[test]
    fn markdown_has_every_block() {
        let mut d = Document::new();
        d.heading(1, "hyperlens report");
        d.contents();
        d.heading(2, "a");
        d.paragraph("Text `x`.");
        d.table(
            vec!["k".into(), "v".into()],
            vec![vec!["1".into(), "2".into()]],
        );
        d.figure(FigureRef {
            id: "a-fig".into(),
            short: "fig".into(),
            caption: "Cap".into(),
            text: "says 3".into(),
            src: "figures/a.png".into(),
            width: 700,
            interactive: None,
        });
        let md = d.to_markdown();
        assert!(
            md.starts_with("# hyperlens report\n\n- [a](#a)\n\n## a\n\nText `x`.\n"),
            "{md}"
        );
        assert!(md.contains("| k | v |\n|---|---|\n| 1 | 2 |\n"), "{md}");
        assert!(
            md.contains("**Cap.** says 3\n\n![Cap](figures/a.png)\n"),
            "{md}"
        );
        assert_eq!(d.sections()[0].2.len(), 1);
    }
}
