//! Line charts as SVG, for the scaling curves (`km0 bench curve`): axes with ticks, one
//! polyline with markers per series, a legend. Linear or logarithmic axes.

use std::fmt::Write as _;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points (x, y), in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
/// Line colours, one per series in turn (a colour-blind-safe palette).
const COLOURS: [&str; 6] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
];

/// One axis: its range and how values map onto it.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn of(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Self {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = (if log { 1.0 } else { 0.0 }, 1.0);
        }
        if log {
            lo = 10f64.powf(lo.log10().floor());
            hi = 10f64.powf(hi.log10().ceil().max(lo.log10() + 1.0));
        } else {
            if from_zero {
                lo = lo.min(0.0);
            }
            let step = nice_step((hi - lo).max(f64::EPSILON) / 5.0);
            lo = (lo / step).floor() * step;
            hi = ((hi / step).ceil() * step).max(lo + step);
        }
        Self { lo, hi, log }
    }

    /// Where `v` falls between 0 (low end) and 1 (high end).
    fn fraction(&self, v: f64) -> f64 {
        if self.log {
            (v.max(f64::MIN_POSITIVE).log10() - self.lo.log10())
                / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().round() as i32,
                self.hi.log10().round() as i32,
            );
            (a..=b).map(|e| 10f64.powi(e)).collect()
        } else {
            let step = nice_step((self.hi - self.lo) / 5.0);
            let mut ticks = Vec::new();
            let mut t = self.lo;
            while t <= self.hi + step / 2.0 && ticks.len() < 20 {
                ticks.push(t);
                t += step;
            }
            ticks
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

/// A tick's text: thousands as `k`, small values with decimals.
fn label(v: f64) -> String {
    if v.abs() >= 1000.0 && (v / 1000.0).fract() == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The chart as a standalone SVG document.
pub fn svg(chart: &Chart) -> String {
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let x = Axis::of(points().map(|p| p.0), chart.log_x, false);
    let y = Axis::of(points().map(|p| p.1), chart.log_y, true);
    let (w, h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let px = |v: f64| LEFT + x.fraction(v) * w;
    let py = |v: f64| TOP + (1.0 - y.fraction(v)) * h;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        LEFT + w / 2.0,
        escape(&chart.title)
    );
    for t in x.ticks() {
        let at = px(t);
        let _ = writeln!(
            out,
            r##"<line x1="{at:.1}" y1="{TOP}" x2="{at:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{at:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + h,
            TOP + h + 18.0,
            label(t)
        );
    }
    for t in y.ticks() {
        let at = py(t);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{at:.1}" x2="{:.1}" y2="{at:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + w,
            LEFT - 6.0,
            at + 4.0,
            label(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + w / 2.0,
        HEIGHT - 16.0,
        escape(&chart.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        TOP + h / 2.0,
        TOP + h / 2.0,
        escape(&chart.y_label)
    );
    for (i, series) in chart.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let drawn: Vec<(f64, f64)> = series
            .points
            .iter()
            .filter(|(a, b)| a.is_finite() && b.is_finite() && (!chart.log_y || *b > 0.0))
            .map(|(a, b)| (px(*a), py(*b)))
            .collect();
        let path: Vec<String> = drawn
            .iter()
            .map(|(a, b)| format!("{a:.1},{b:.1}"))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for (a, b) in &drawn {
            let _ = writeln!(
                out,
                r#"<circle cx="{a:.1}" cy="{b:.1}" r="3" fill="{colour}"/>"#
            );
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + w + 14.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(&series.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn chart(log_y: bool) -> Chart {
        Chart {
            title: "msgs/s <by> batch".into(),
            x_label: "batch".into(),
            y_label: "msgs/s".into(),
            log_x: true,
            log_y,
            series: vec![
                Series {
                    name: "set-based".into(),
                    points: vec![(10.0, 900.0), (100.0, 7_500.0), (1000.0, 16_000.0)],
                },
                Series {
                    name: "per event".into(),
                    points: vec![(10.0, 800.0), (100.0, 2_400.0)],
                },
            ],
        }
    }

    #[test]
    fn every_series_is_a_line_with_a_marker_per_point_and_a_legend() {
        let svg = svg(&chart(false));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 5);
        assert!(svg.contains(">set-based</text>") && svg.contains(">per event</text>"));
        assert!(svg.contains("msgs/s &lt;by&gt; batch"), "text is escaped");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }

    #[test]
    fn points_fall_inside_the_plot_area() {
        for log_y in [false, true] {
            let svg = svg(&chart(log_y));
            for circle in svg.split("<circle").skip(1) {
                let num = |key: &str| -> f64 {
                    let start = circle.find(key).unwrap() + key.len();
                    let rest = &circle[start..];
                    rest[..rest.find('"').unwrap()].parse().unwrap()
                };
                let (cx, cy) = (num("cx=\""), num("cy=\""));
                assert!((LEFT..=WIDTH - RIGHT).contains(&cx), "{cx}");
                assert!((TOP..=HEIGHT - BOTTOM).contains(&cy), "{cy}");
            }
        }
    }

    #[test]
    fn log_ticks_are_powers_of_ten_and_linear_ticks_are_round() {
        let axis = Axis::of([3.0, 700.0].into_iter(), true, false);
        assert_eq!(axis.ticks(), [1.0, 10.0, 100.0, 1000.0]);
        let axis = Axis::of([0.0, 7_300.0].into_iter(), false, true);
        assert_eq!(axis.ticks(), [0.0, 2000.0, 4000.0, 6000.0, 8000.0]);
        assert_eq!(label(16_000.0), "16k");
    }
}
