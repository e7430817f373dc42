//! The HTML rendering of a [`Document`] (`index.html`): pulldown-cmark renders the Markdown of
//! paragraphs, tables and captions (CommonMark with GitHub tables); this module only lays out the
//! page around it: a sidebar with the table of contents (sections and their figures), anchors on
//! headings and figures, tables in horizontally scrolling wrappers, and rows of figures in which
//! narrow figures sit side by side.

use std::fmt::Write as _;

use pulldown_cmark::{html, Options, Parser};

use crate::doc::{table_markdown, Block, Document, FigureRef};

/// Figures at most this wide (pixels) take half a row of the HTML page, so that two sit side by
/// side; wider ones take the whole row.
pub const HALF_ROW_MAX_WIDTH: u32 = 1000;

/// Escapes text for HTML element content and attribute values.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Markdown to HTML by pulldown-cmark (tables enabled).
fn markdown(md: &str) -> String {
    let mut out = String::new();
    html::push_html(&mut out, Parser::new_ext(md, Options::ENABLE_TABLES));
    out
}

fn figure_html(f: &FigureRef) -> String {
    let class = if f.width <= HALF_ROW_MAX_WIDTH {
        " class=\"half\""
    } else {
        ""
    };
    let caption = markdown(&format!("**{}.** {}", f.caption, f.text));
    if let Some(live) = &f.interactive {
        // The interactive SVG (its own document, so its script and data load once, from
        // file:// too), at its canvas's width and aspect ratio, with the PNG as the fallback of
        // the object and for readers without scripts.
        let (w, h) = live.size;
        return format!(
            "<figure id=\"{id}\"{class}><figcaption>{caption}</figcaption><object class=\"hl-live\" style=\"width:{w}px;aspect-ratio:{w}/{h}\" data=\"{svg}\" type=\"image/svg+xml\" aria-label=\"{alt}\"><a href=\"{src}\"><img src=\"{src}\" alt=\"{alt}\"></a></object><noscript><a href=\"{src}\"><img src=\"{src}\" alt=\"{alt}\"></a></noscript><p class=\"hl-links\">Interactive: {hint}. <a href=\"{svg}\">Open alone</a> · <a href=\"{src}\">PNG</a></p></figure>\n",
            id = escape(&f.id),
            caption = caption.trim_end(),
            svg = escape(&live.path),
            hint = escape(&live.hint),
            src = escape(&f.src),
            alt = escape(&f.caption),
        );
    }
    format!(
        "<figure id=\"{id}\"{class}><figcaption>{caption}</figcaption><a href=\"{src}\"><img src=\"{src}\" alt=\"{alt}\"></a></figure>\n",
        id = escape(&f.id),
        caption = caption.trim_end(),
        src = escape(&f.src),
        alt = escape(&f.caption),
    )
}

/// The sidebar: every section, and under each the short names of its figures.
fn contents_html(doc: &Document) -> String {
    let mut s = String::from(
        "<nav class=\"toc\" aria-label=\"Contents\"><p class=\"toc-title\">Contents</p>\n<ul>\n",
    );
    for (text, id, figs) in doc.sections() {
        let _ = write!(s, "<li><a href=\"#{}\">{}</a>", escape(id), escape(text));
        if !figs.is_empty() {
            s.push_str("<ul>");
            for f in figs {
                let _ = write!(
                    s,
                    "<li><a href=\"#{}\">{}</a></li>",
                    escape(&f.id),
                    escape(&f.short)
                );
            }
            s.push_str("</ul>");
        }
        s.push_str("</li>\n");
    }
    s.push_str("</ul></nav>\n");
    s
}

/// The page (`index.html`): a self-contained HTML file with its style sheet; the figures are the
/// PNG files beside it.
pub fn to_html(doc: &Document, title: &str) -> String {
    let mut body = String::new();
    let mut in_figs = false;
    for b in &doc.blocks {
        let is_fig = matches!(b, Block::Figure(_));
        if in_figs && !is_fig {
            body.push_str("</div>\n");
            in_figs = false;
        }
        match b {
            Block::Heading { level, text, id } => {
                let _ = writeln!(
                    body,
                    "<h{level} id=\"{}\">{}</h{level}>",
                    escape(id),
                    escape(text)
                );
            }
            Block::Paragraph(text) => body.push_str(&markdown(text)),
            Block::Table(t) => {
                let _ = write!(
                    body,
                    "<div class=\"scroll\">\n{}</div>\n",
                    markdown(&table_markdown(t))
                );
            }
            Block::Figure(f) => {
                if !in_figs {
                    body.push_str("<div class=\"figs\">\n");
                    in_figs = true;
                }
                body.push_str(&figure_html(f));
            }
            // The contents are the sidebar.
            Block::Contents => {}
        }
    }
    if in_figs {
        body.push_str("</div>\n");
    }
    // Without scripts the interactive figures' objects give way to their PNGs.
    let noscript = if body.contains("class=\"hl-live\"") {
        "<noscript><style>.hl-live,.hl-links{display:none}</style></noscript>"
    } else {
        ""
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title><style>{CSS}</style>{noscript}</head><body>\n<div class=\"page\">\n{}<main>\n{body}</main>\n</div>\n</body></html>\n",
        escape(title),
        contents_html(doc)
    )
}

/// Style of the HTML report: a sticky table of contents beside the text (above it on narrow
/// windows); tables in wrappers that scroll sideways, with header cells that wrap so that the
/// summary table fits a 1,400 px window; figures at their natural size up to the column width.
const CSS: &str = "body{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;line-height:1.45;color:#222;margin:0}\
.page{display:grid;grid-template-columns:15em minmax(0,1fr);gap:2em;max-width:1700px;margin:0 auto;padding:0 1.5em}\
.toc{position:sticky;top:0;align-self:start;max-height:100vh;overflow-y:auto;font-size:88%;padding:1.5em 0;border-right:1px solid #ddd}\
.toc-title{font-weight:bold;margin:0 0 .5em}\
.toc ul{list-style:none;margin:0;padding-left:0}\
.toc ul ul{padding-left:1em;margin:.2em 0 .6em;font-size:95%}\
.toc a{color:#245;text-decoration:none}\
.toc a:hover{text-decoration:underline}\
main{min-width:0;padding-bottom:3em}\
@media (max-width:900px){.page{display:block}.toc{position:static;max-height:none;border-right:0;border-bottom:1px solid #ddd}}\
h1{border-bottom:2px solid #ddd;padding-bottom:.3em}\
h2{margin-top:2.2em;border-bottom:1px solid #ddd;padding-bottom:.2em}\
p{max-width:60em}\
code{background:#f3f3f3;padding:0 .25em;border-radius:3px;font-size:90%}\
.scroll{overflow-x:auto;max-width:100%}\
table{border-collapse:collapse;margin:1em 0;font-size:90%}\
td,th{border:1px solid #ccc;padding:4px 7px;text-align:right}\
td{white-space:nowrap}\
th{background:#f3f3f3;white-space:normal;vertical-align:bottom;max-width:9em}\
td:first-child,th:first-child{text-align:left}\
tr:nth-child(even) td{background:#fafafa}\
.figs{display:flex;flex-wrap:wrap;gap:1.5em 2em;align-items:flex-start;margin:1em 0}\
figure{margin:0;flex:0 1 auto;max-width:100%}\
figure.half{max-width:calc(50% - 1em)}\
figcaption{max-width:46em;margin-bottom:.5em;font-size:95%}\
figcaption p{margin:0}\
img{display:block;max-width:100%;height:auto;border:1px solid #eee}\
object.hl-live{display:block;max-width:100%;height:auto;border:1px solid #eee}\
.hl-links{font-size:85%;color:#555;margin:.3em 0 0}";

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(id: &str, width: u32) -> FigureRef {
        FigureRef {
            id: id.into(),
            short: id.into(),
            caption: format!("Cap {id}"),
            text: "says `3` & more".into(),
            src: format!("figures/{id}.png"),
            width,
            interactive: None,
        }
    }

    #[test]
    fn blocks_render_through_pulldown_cmark() {
        let mut d = Document::new();
        d.heading(1, "hyperlens report");
        d.contents();
        d.heading(2, "tiny-hyla");
        d.paragraph("**Bold** text `x` & y");
        d.table(
            vec!["a".into(), "b".into()],
            vec![vec!["1".into(), "2 %".into()]],
        );
        d.figure(fig("narrow", 700));
        d.figure(fig("wide", 1500));
        d.paragraph("after");
        let h = to_html(&d, "hyperlens report");
        assert!(h.starts_with("<!DOCTYPE html>") && h.trim_end().ends_with("</html>"));
        assert!(h.contains("<h2 id=\"tiny-hyla\">tiny-hyla</h2>"), "{h}");
        assert!(
            h.contains("<p><strong>Bold</strong> text <code>x</code> &amp; y</p>"),
            "{h}"
        );
        assert!(h.contains("<div class=\"scroll\">\n<table>"), "{h}");
        assert!(
            h.contains("<th>a</th>") && h.contains("<td>2 %</td>"),
            "{h}"
        );
        assert!(h.contains("<div class=\"figs\">\n<figure id=\"narrow\" class=\"half\"><figcaption><p><strong>Cap narrow.</strong> says <code>3</code> &amp; more</p></figcaption><a href=\"figures/narrow.png\"><img src=\"figures/narrow.png\" alt=\"Cap narrow\"></a></figure>\n<figure id=\"wide\"><figcaption>"), "{h}");
        assert!(h.contains("</figure>\n</div>\n<p>after</p>"), "{h}");
        assert!(
            !h.contains("<noscript>"),
            "no interactive figure, no fallback style"
        );
        // The sidebar lists the section and its figures.
        assert!(h.contains("<li><a href=\"#tiny-hyla\">tiny-hyla</a><ul><li><a href=\"#narrow\">narrow</a></li>"), "{h}");
    }

    #[test]
    fn interactive_figures_embed_their_svg_with_the_png_as_fallback() {
        let mut d = Document::new();
        d.heading(2, "x");
        let mut f = fig("pca", 1800);
        f.interactive = Some(crate::doc::Interactive {
            path: "figures/pca_explorer.svg".into(),
            size: (1040, 640),
            hint: "hover, click, zoom".into(),
        });
        d.figure(f);
        let h = to_html(&d, "t");
        assert!(h.contains("<object class=\"hl-live\" style=\"width:1040px;aspect-ratio:1040/640\" data=\"figures/pca_explorer.svg\" type=\"image/svg+xml\" aria-label=\"Cap pca\"><a href=\"figures/pca.png\"><img src=\"figures/pca.png\" alt=\"Cap pca\"></a></object><noscript>"), "{h}");
        assert!(
            h.contains(
                "<noscript><style>.hl-live,.hl-links{display:none}</style></noscript></head>"
            ),
            "{h}"
        );
        // index.md keeps the PNG.
        assert!(
            d.to_markdown().contains("figures/pca.png") && !d.to_markdown().contains("explorer")
        );
    }
}
