//! The site benchmark's plot: a hand-written SVG of the site's latency
//! quantiles (p50, p99, p99.9) per condition, one panel per storm, on a
//! logarithmic scale shared by the panels.

/// One storm's bars: per condition, its label and its p50, p99 and p99.9
/// in ms.
pub struct Panel {
    pub title: String,
    pub groups: Vec<(String, [f64; 3])>,
}

const QUANTILES: [(&str, &str); 3] = [("p50", "#9ecae1"), ("p99", "#4292c6"), ("p99.9", "#08519c")];

const LEFT: f64 = 64.0;
const TOP: f64 = 64.0;
const PLOT_HEIGHT: f64 = 260.0;
const PANEL_WIDTH: f64 = 300.0;
const BAR: f64 = 25.0;
const GROUP_GAP: f64 = 18.0;

/// The SVG document.
pub fn svg(title: &str, panels: &[Panel]) -> String {
    let values: Vec<f64> = panels
        .iter()
        .flat_map(|p| p.groups.iter().flat_map(|(_, q)| q.iter().copied()))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let low = values
        .iter()
        .copied()
        .fold(f64::MAX, f64::min)
        .log10()
        .floor()
        .min(0.0);
    let high = values
        .iter()
        .copied()
        .fold(1.0, f64::max)
        .log10()
        .ceil()
        .max(low + 1.0);
    let y =
        |v: f64| TOP + PLOT_HEIGHT * (1.0 - (v.max(10f64.powf(low)).log10() - low) / (high - low));
    let width = LEFT + PANEL_WIDTH * panels.len() as f64 + 20.0;
    let height = TOP + PLOT_HEIGHT + 56.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        escape(title)
    );
    // The legend.
    for (i, (name, color)) in QUANTILES.iter().enumerate() {
        let x = LEFT + i as f64 * 70.0;
        out.push_str(&format!(
            "<rect x=\"{x}\" y=\"32\" width=\"12\" height=\"12\" fill=\"{color}\"/><text x=\"{}\" y=\"43\">{name}</text>\n",
            x + 16.0
        ));
    }
    // The scale: a line and label per decade, faint lines at 2 and 5.
    let right = width - 20.0;
    for decade in low as i32..=high as i32 {
        let base = 10f64.powi(decade);
        for (factor, stroke) in [(1.0, "#bbb"), (2.0, "#eee"), (5.0, "#eee")] {
            let v = base * factor;
            if v.log10() > high + 1e-9 {
                continue;
            }
            let at = y(v);
            out.push_str(&format!(
                "<line x1=\"{LEFT}\" y1=\"{at:.1}\" x2=\"{right}\" y2=\"{at:.1}\" stroke=\"{stroke}\"/>\n"
            ));
            if factor == 1.0 {
                let label = if v >= 1000.0 {
                    format!("{} s", v / 1000.0)
                } else {
                    format!("{v} ms")
                };
                out.push_str(&format!(
                    "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\n",
                    LEFT - 6.0,
                    at + 4.0,
                ));
            }
        }
    }
    for (p, panel) in panels.iter().enumerate() {
        out.push_str(&panel_svg(panel, LEFT + p as f64 * PANEL_WIDTH, &y));
    }
    out.push_str("</svg>\n");
    out
}

/// One panel's title, bars, values and labels, from `x`.
fn panel_svg(panel: &Panel, x: f64, y: &dyn Fn(f64) -> f64) -> String {
    let bottom = TOP + PLOT_HEIGHT;
    let group_width = BAR * QUANTILES.len() as f64;
    let mut out = format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\n",
        x + PANEL_WIDTH / 2.0,
        height_of_title(),
        escape(&panel.title)
    );
    for (g, (label, values)) in panel.groups.iter().enumerate() {
        let gx = x + 16.0 + g as f64 * (group_width + GROUP_GAP);
        for (q, value) in values.iter().enumerate() {
            if !value.is_finite() {
                continue;
            }
            let bx = gx + q as f64 * BAR;
            let top = y(*value);
            out.push_str(&format!(
                "<rect x=\"{bx:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{label} {}: {}</title></rect>\n",
                BAR - 2.0,
                bottom - top,
                QUANTILES[q].1,
                QUANTILES[q].0,
                trim(*value)
            ));
            out.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{}</text>\n",
                bx + (BAR - 2.0) / 2.0,
                top - 3.0,
                trim(*value)
            ));
        }
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            gx + group_width / 2.0,
            bottom + 18.0,
            escape(label)
        ));
    }
    out
}

/// Where panel titles go: under the plot.
fn height_of_title() -> f64 {
    TOP + PLOT_HEIGHT + 42.0
}

/// A value in ms with the digits it needs (3 significant, no trailing
/// zeros), or in seconds from 1000 ms.
fn trim(value: f64) -> String {
    if value >= 1000.0 {
        return format!("{:.1} s", value / 1000.0);
    }
    let text = if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('`', "")
}
