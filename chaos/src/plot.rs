//! A picture of one run: an SVG timeline in the manner of Jepsen's
//! plots. Time runs left to right; each worker has a lane; each holder's
//! window (the checker's: grant to the earliest of its last deadline, its
//! release and its lost signal) is a bar coloured by resource and labelled
//! with its token where the label fits; every fault is a shaded band with
//! its label; every violation is marked in red: the stretch two windows of
//! one resource share, and the later grant of a duplicate or decreasing
//! token (a triangle, with a dashed line back to the earlier grant).
//!
//! Pure: a history and its check in, a string out. Hand-written SVG (the
//! suite adds no dependency for it); every element carries a `<title>`,
//! which viewers show on hover, with the exact figures.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::history::{by_resource, holds, token_pairs, Event, Hold, NemesisPhase, Report};

/// Resource colours (Tableau 10 without its red, which marks violations).
const PALETTE: [&str; 9] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
    "#bab0ac",
];
const RED: &str = "#d62728";
const LEFT: f64 = 120.0;
const RIGHT: f64 = 20.0;
/// Title, summary and legend.
const HEADER: f64 = 70.0;
/// Two rows of fault labels above the lanes.
const FAULT_ROWS: f64 = 28.0;
const LANE: f64 = 20.0;
const BAR: f64 = 12.0;
const AXIS: f64 = 30.0;
/// Width of one character of the 9 px monospace labels.
const CHAR: f64 = 5.5;

/// The SVG of one run's history, checked as `report`.
pub fn svg(title: &str, events: &[Event], report: &Report) -> String {
    let (holds, _) = holds(events);
    let end_ns = events
        .iter()
        .flat_map(stamps)
        .chain(holds.iter().map(Hold::end))
        .max()
        .unwrap_or(0)
        .max(1);
    let workers: BTreeSet<u32> = holds.iter().map(|h| h.who.worker).collect();
    let lanes: BTreeMap<u32, usize> = workers.iter().enumerate().map(|(i, &w)| (w, i)).collect();
    let resources: BTreeSet<&str> = holds.iter().map(|h| h.resource).collect();
    let colour: BTreeMap<&str, &str> = resources
        .iter()
        .enumerate()
        .map(|(i, &r)| (r, PALETTE[i % PALETTE.len()]))
        .collect();
    let secs = end_ns as f64 / 1e9;
    // Wide enough to tell 10 ms apart in a short run, at most about 5,000
    // px for runs up to half a minute.
    let px_per_s = (4800.0 / secs).clamp(100.0, 250.0);
    let p = Page {
        px_per_ns: px_per_s / 1e9,
        lanes_top: HEADER + FAULT_ROWS,
    };
    let lanes_h = LANE * lanes.len().max(1) as f64;
    let width = LEFT + secs * px_per_s + RIGHT;
    let height = p.lanes_top + lanes_h + AXIS;

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="monospace" font-size="9">
<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="white"/>
"#
    );
    header(&mut s, title, report, &colour);
    // Lanes, then the fault bands over them, then the bars and marks.
    for (i, &w) in workers.iter().enumerate() {
        let y = p.lanes_top + LANE * i as f64;
        let fill = if i % 2 == 0 { "#f7f7f7" } else { "#ffffff" };
        let _ = writeln!(
            s,
            r#"<rect x="{LEFT}" y="{y}" width="{:.1}" height="{LANE}" fill="{fill}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            width - LEFT - RIGHT,
            LEFT - 6.0,
            y + LANE / 2.0 + 3.0,
            lane_name(w)
        );
    }
    faults(&mut s, &p, events, end_ns, lanes_h);
    axis(&mut s, &p, end_ns, px_per_s, lanes_h);
    for h in &holds {
        bar(&mut s, &p, h, lanes[&h.who.worker], colour[h.resource]);
    }
    for (resource, hs) in by_resource(&holds) {
        overlaps(&mut s, &p, &lanes, &hs);
        let (duplicates, inverted) = token_pairs(resource, &hs);
        let at = |lease: u64| hs.iter().find(|h| h.who.lease == lease).copied();
        for (kind, pairs) in [("duplicate", duplicates), ("decreasing", inverted)] {
            for pair in pairs {
                if let (Some(earlier), Some(later)) = (at(pair.earlier.lease), at(pair.later.lease))
                {
                    token_mark(&mut s, &p, &lanes, (earlier, later), kind);
                }
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// Where things go on the page.
struct Page {
    px_per_ns: f64,
    lanes_top: f64,
}

impl Page {
    fn x(&self, ns: u64) -> f64 {
        LEFT + ns as f64 * self.px_per_ns
    }

    fn lane_y(&self, lane: usize) -> f64 {
        self.lanes_top + LANE * lane as f64
    }
}

/// Every time stamp an event carries.
fn stamps(e: &Event) -> Vec<u64> {
    match e {
        Event::Attempt { end_ns, .. }
        | Event::Write { end_ns, .. }
        | Event::Increment { end_ns, .. } => vec![*end_ns],
        Event::Grant { at_ns, .. }
        | Event::Extend { at_ns, .. }
        | Event::Release { at_ns, .. }
        | Event::Lost { at_ns, .. }
        | Event::Nemesis { at_ns, .. } => vec![*at_ns],
        _ => Vec::new(),
    }
}

/// Workers of the parent are numbered from 1; those of process `p` from
/// `100 × (p + 1)` (`rig.rs`).
fn lane_name(worker: u32) -> String {
    match worker {
        0..100 => format!("task {worker}"),
        w => format!("proc {} task {}", w / 100 - 1, w % 100),
    }
}

fn header(s: &mut String, title: &str, r: &Report, colour: &BTreeMap<&str, &str>) {
    let verdict = if r.is_safe() { "safe" } else { "UNSAFE" };
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="13" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="34" font-size="10">grants {} · overlapping holders {} · duplicate tokens {} · decreasing tokens {} · {verdict}</text>"#,
        r.grants, r.overlaps.count, r.duplicate_tokens.count, r.token_inversions.count
    );
    let mut x = 10.0;
    let y = 52.0;
    for (resource, c) in colour {
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="14" height="{BAR}" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
            y - 9.0,
            x + 18.0,
            y,
            esc(resource)
        );
        x += 30.0 + CHAR * resource.len() as f64;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{x}" y="{}" width="14" height="{BAR}" fill="#888888" fill-opacity="0.25"/><text x="{}" y="{y}">fault</text>"##,
        y - 9.0,
        x + 18.0
    );
    x += 60.0;
    let _ = writeln!(
        s,
        r#"<rect x="{x}" y="{}" width="14" height="{BAR}" fill="{RED}" fill-opacity="0.75"/><text x="{}" y="{y}">two holders</text>"#,
        y - 9.0,
        x + 18.0
    );
    x += 100.0;
    let _ = writeln!(
        s,
        r#"<path d="{}" fill="{RED}"/><text x="{}" y="{y}">duplicate or decreasing token</text>"#,
        triangle(x + 7.0, y - 9.0),
        x + 18.0
    );
}

/// A downward triangle whose tip is at `(x, tip_y + 8)`.
fn triangle(x: f64, top: f64) -> String {
    format!(
        "M{:.1},{:.1} L{:.1},{:.1} L{:.1},{:.1} Z",
        x - 5.0,
        top,
        x + 5.0,
        top,
        x,
        top + 8.0
    )
}

/// Each fault a band over every lane, from its start to its stop (a start
/// without a stop runs to the end). Starts and stops of one name pair in
/// order: a fault's stop is the first stop after the earliest fault of
/// that name still open.
fn faults(s: &mut String, p: &Page, events: &[Event], end_ns: u64, lanes_h: f64) {
    let mut marks: Vec<(u64, &str, NemesisPhase, &str)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Nemesis {
                at_ns,
                name,
                phase,
                detail,
            } => Some((
                *at_ns,
                name.as_str(),
                *phase,
                detail.as_deref().unwrap_or(""),
            )),
            _ => None,
        })
        .collect();
    marks.sort_by_key(|m| (m.0, m.2 == NemesisPhase::Start));
    let mut open: BTreeMap<&str, Vec<(u64, &str)>> = BTreeMap::new();
    let mut bands = Vec::new();
    for (at, name, phase, detail) in marks {
        match phase {
            NemesisPhase::Start => open.entry(name).or_default().push((at, detail)),
            _ => {
                if let Some(list) = open.get_mut(name).filter(|l| !l.is_empty()) {
                    let (start, detail) = list.remove(0);
                    bands.push((start, Some(at), name, detail));
                }
            }
        }
    }
    for (name, list) in open {
        bands.extend(list.into_iter().map(|(at, d)| (at, None, name, d)));
    }
    bands.sort_by_key(|b| b.0);
    for (i, (start, stop, name, detail)) in bands.into_iter().enumerate() {
        let x0 = p.x(start);
        let x1 = p.x(stop.unwrap_or(end_ns)).max(x0 + 1.0);
        let label = fault_label(name, detail);
        let row_y = HEADER + 11.0 + 12.0 * (i % 2) as f64;
        let when = match stop {
            Some(t) => format!("{:.3}–{:.3} s", start as f64 / 1e9, t as f64 / 1e9),
            None => format!("from {:.3} s, not healed", start as f64 / 1e9),
        };
        let _ = writeln!(
            s,
            r##"<g class="fault"><title>{}: {} ({when})</title><rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#888888" fill-opacity="0.18"/><text x="{x0:.1}" y="{row_y:.1}" fill="#555555">{}</text></g>"##,
            esc(name),
            esc(detail),
            HEADER + 2.0 + 12.0 * (i % 2) as f64,
            x1 - x0,
            p.lanes_top + lanes_h - HEADER - 2.0 - 12.0 * (i % 2) as f64,
            esc(&label)
        );
    }
}

/// The fault's name and the nodes it hit (the detail's `node`/`nodes`
/// list), or the detail's first part when it names no node.
fn fault_label(name: &str, detail: &str) -> String {
    let words: Vec<&str> = detail.split_whitespace().collect();
    let nodes = words
        .windows(2)
        .find(|w| w[0] == "node" || w[0] == "nodes")
        .map(|w| format!("{} {}", w[0], w[1].trim_end_matches(',')));
    let what = nodes.unwrap_or_else(|| {
        let first = detail.split([',', '(']).next().unwrap_or("").trim();
        first.chars().take(28).collect()
    });
    if what.is_empty() {
        name.to_owned()
    } else {
        format!("{name} {what}")
    }
}

fn axis(s: &mut String, p: &Page, end_ns: u64, px_per_s: f64, lanes_h: f64) {
    let y = p.lanes_top + lanes_h;
    let step_s = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0]
        .into_iter()
        .find(|st| st * px_per_s >= 80.0)
        .unwrap_or(600.0);
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{y}" x2="{:.1}" y2="{y}" stroke="#333333"/>"##,
        p.x(end_ns)
    );
    let mut t = 0.0;
    while t * 1e9 <= end_ns as f64 {
        let x = p.x((t * 1e9) as u64);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{:.1}" stroke="#dddddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{t} s</text>"##,
            p.lanes_top,
            y + 4.0,
            y + 16.0
        );
        t += step_s;
    }
}

fn bar(s: &mut String, p: &Page, h: &Hold<'_>, lane: usize, colour: &str) {
    let (x0, x1) = (p.x(h.at_ns), p.x(h.end().max(h.at_ns)));
    let w = (x1 - x0).max(1.0);
    let y = p.lane_y(lane) + (LANE - BAR) / 2.0;
    let token = h.token.map_or("none".to_owned(), |t| t.to_string());
    let _ = write!(
        s,
        r#"<g class="hold"><title>{} lease {} (worker {}), token {token}: {:.3}–{:.3} s</title><rect x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{BAR}" fill="{colour}"/>"#,
        esc(h.resource),
        h.who.lease,
        h.who.worker,
        h.at_ns as f64 / 1e9,
        h.end() as f64 / 1e9,
    );
    if let Some(label) = h.token.and_then(|t| fit(&t.to_string(), w - 4.0)) {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" fill="white">{label}</text>"#,
            x0 + 2.0,
            y + BAR - 3.0
        );
    }
    s.push_str("</g>\n");
}

/// `text`, or as many of its last characters as fit in `room` px after an
/// ellipsis (at least three), or nothing.
fn fit(text: &str, room: f64) -> Option<String> {
    let fits = (room / CHAR).floor() as usize;
    let len = text.chars().count();
    if len <= fits {
        return Some(text.to_owned());
    }
    let keep = fits.checked_sub(1).filter(|&k| k >= 3)?;
    let tail: String = text.chars().skip(len - keep).collect();
    Some(format!("…{tail}"))
}

/// Every stretch two windows of one resource share (`hs` sorted by start),
/// in red on both lanes, joined by a red line at its start.
fn overlaps(s: &mut String, p: &Page, lanes: &BTreeMap<u32, usize>, hs: &[&Hold<'_>]) {
    let mut active: Vec<&Hold<'_>> = Vec::new();
    for &h in hs {
        if h.end() <= h.at_ns {
            continue; // known only once it was over: it held nothing
        }
        active.retain(|a| a.end() > h.at_ns);
        for a in &active {
            let (from, to) = (h.at_ns, h.end().min(a.end()));
            let (x0, x1) = (p.x(from), p.x(to));
            let (la, lh) = (lanes[&a.who.worker], lanes[&h.who.worker]);
            let _ = write!(
                s,
                r#"<g class="overlap"><title>{}: lease {} (worker {}) and lease {} (worker {}) both held it for {:.3} ms from {:.3} s</title>"#,
                esc(h.resource),
                a.who.lease,
                a.who.worker,
                h.who.lease,
                h.who.worker,
                (to - from) as f64 / 1e6,
                from as f64 / 1e9
            );
            for lane in [la, lh] {
                let _ = write!(
                    s,
                    r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{RED}" fill-opacity="0.75" stroke="{RED}"/>"#,
                    p.lane_y(lane) + 1.0,
                    (x1 - x0).max(2.0),
                    LANE - 2.0
                );
            }
            let _ = writeln!(
                s,
                r#"<line x1="{x0:.1}" y1="{:.1}" x2="{x0:.1}" y2="{:.1}" stroke="{RED}" stroke-width="1.5"/></g>"#,
                p.lane_y(la) + LANE / 2.0,
                p.lane_y(lh) + LANE / 2.0
            );
        }
        active.push(h);
    }
}

/// A red triangle over the later grant of a token pair, and a dashed line
/// back to the earlier grant.
fn token_mark(
    s: &mut String,
    p: &Page,
    lanes: &BTreeMap<u32, usize>,
    (earlier, later): (&Hold<'_>, &Hold<'_>),
    kind: &str,
) {
    let (xe, xl) = (p.x(earlier.at_ns), p.x(later.at_ns));
    let (ye, yl) = (
        p.lane_y(lanes[&earlier.who.worker]),
        p.lane_y(lanes[&later.who.worker]),
    );
    let _ = writeln!(
        s,
        r#"<g class="token-mark"><title>{kind} token on {}: {} of lease {} (worker {}) after {} of lease {} (worker {})</title><line x1="{xe:.1}" y1="{:.1}" x2="{xl:.1}" y2="{:.1}" stroke="{RED}" stroke-dasharray="3,2"/><path d="{}" fill="{RED}"/></g>"#,
        esc(later.resource),
        later.token.unwrap_or(0),
        later.who.lease,
        later.who.worker,
        earlier.token.unwrap_or(0),
        earlier.who.lease,
        earlier.who.worker,
        ye + LANE / 2.0,
        yl + LANE / 2.0,
        triangle(xl, yl - 4.0)
    );
}

/// Text for XML: the five characters with a meaning there, escaped.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::check;

    fn grant(worker: u32, lease: u64, at_ns: u64, valid_until_ns: u64, token: u64) -> Event {
        Event::Grant {
            worker,
            resource: "r0".into(),
            lease,
            start_ns: at_ns - 1,
            at_ns,
            valid_until_ns,
            token: Some(token),
        }
    }

    fn nemesis(at_ns: u64, phase: NemesisPhase, detail: &str) -> Event {
        Event::Nemesis {
            at_ns,
            name: "failover".into(),
            phase,
            detail: Some(detail.into()),
        }
    }

    fn plot(events: &[Event]) -> String {
        svg("a <test> & \"run\"", events, &check(events))
    }

    const MS: u64 = 1_000_000;

    /// Two holders one after the other, under a fault, then a third.
    fn clean() -> Vec<Event> {
        vec![
            nemesis(50 * MS, NemesisPhase::Start, "nodes 1,3 to replicas"),
            grant(1, 1, 100 * MS, 500 * MS, 7),
            Event::Release {
                lease: 1,
                at_ns: 300 * MS,
            },
            grant(101, 2, 300 * MS, 700 * MS, 8),
            nemesis(600 * MS, NemesisPhase::Stop, "nodes 1,3, 4 drops"),
            grant(2, 3, 800 * MS, 1200 * MS, 9),
        ]
    }

    #[test]
    fn a_clean_history_has_bars_bands_and_no_red_mark() {
        let s = plot(&clean());
        assert_well_formed(&s);
        assert_eq!(s.matches(r#"class="hold""#).count(), 3);
        assert_eq!(s.matches(r#"class="fault""#).count(), 1);
        assert!(s.contains(">failover nodes 1,3</text>"), "{s}");
        assert!(!s.contains(r#"class="overlap""#) && !s.contains(r#"class="token-mark""#));
        assert!(s.contains("proc 0 task 1") && s.contains("task 2"));
        assert!(s.contains("a &lt;test&gt; &amp; &quot;run&quot;"));
        assert!(s.contains("overlapping holders 0 · duplicate tokens 0"));
    }

    #[test]
    fn an_overlap_is_marked_in_red_on_both_lanes() {
        let mut events = clean();
        // Lease 2 granted while lease 1 still held it, with lease 1's token.
        events[3] = grant(101, 2, 200 * MS, 700 * MS, 7);
        let s = plot(&events);
        assert_well_formed(&s);
        assert_eq!(s.matches(r#"class="overlap""#).count(), 1, "{s}");
        let overlap = s.split(r#"class="overlap""#).nth(1).unwrap();
        let overlap = &overlap[..overlap.find("</g>").unwrap()];
        assert_eq!(overlap.matches(&format!(r#"fill="{RED}""#)).count(), 2);
        assert!(overlap.contains("both held it for 100.000 ms from 0.200 s"));
        assert_eq!(s.matches(r#"class="token-mark""#).count(), 1);
        assert!(s.contains("duplicate token on r0: 7 of lease 2 (worker 101) after 7 of lease 1"));
    }

    #[test]
    fn a_decreasing_token_is_marked_without_an_overlap() {
        let mut events = clean();
        events[5] = grant(2, 3, 800 * MS, 1200 * MS, 6);
        let s = plot(&events);
        assert_well_formed(&s);
        assert!(!s.contains(r#"class="overlap""#));
        assert!(s.contains("decreasing token on r0: 6 of lease 3 (worker 2) after 8 of lease 2"));
    }

    #[test]
    fn a_fault_never_healed_runs_to_the_end_and_labels_fit_their_bars() {
        let events = vec![
            nemesis(10 * MS, NemesisPhase::Start, "worker process 0 (pid 9)"),
            grant(1, 1, 100 * MS, 900 * MS, 1_796_456_481_857_125),
            grant(2, 2, 950 * MS, 960 * MS, 1_796_456_481_857_126),
        ];
        let s = plot(&events);
        assert_well_formed(&s);
        assert!(s.contains("not healed") && s.contains(">failover worker process 0</text>"));
        // 800 ms at 250 px/s is 200 px: the whole token; 10 ms is 2.5 px:
        // none.
        assert!(s.contains(">1796456481857125</text>"));
        assert!(!s.contains("857126</text>"));
        assert_eq!(fit("1796456481857125", 40.0), Some("…857125".into()));
        assert_eq!(fit("1796456481857125", 12.0), None);
    }

    #[test]
    fn an_empty_history_is_still_a_picture() {
        assert_well_formed(&plot(&[]));
    }

    /// A small well-formedness check: every tag closes in order, the
    /// prolog and comments are skipped, attribute values are quoted, and
    /// text and values hold no `<` and no `&` outside an entity.
    fn assert_well_formed(doc: &str) {
        let mut stack: Vec<&str> = Vec::new();
        let mut rest = doc;
        let mut roots = 0;
        while let Some(open) = rest.find('<') {
            check_text(&rest[..open]);
            let after = &rest[open..];
            if let Some(body) = after.strip_prefix("<?") {
                rest = &body[body.find("?>").expect("prolog ends") + 2..];
                continue;
            }
            if let Some(body) = after.strip_prefix("<!--") {
                rest = &body[body.find("-->").expect("comment ends") + 3..];
                continue;
            }
            let close = after.find('>').expect("tag ends");
            let tag = &after[1..close];
            rest = &after[close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim()), "</{name}> out of order");
                continue;
            }
            let (tag, empty) = match tag.strip_suffix('/') {
                Some(t) => (t, true),
                None => (tag, false),
            };
            let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
            let name = &tag[..name_end];
            assert!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "bad tag name in <{tag}>"
            );
            check_attributes(&tag[name_end..]);
            if stack.is_empty() {
                roots += 1;
            }
            if !empty {
                stack.push(name);
            }
        }
        check_text(rest);
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        assert_eq!(roots, 1, "one root element");
    }

    fn check_attributes(mut attrs: &str) {
        loop {
            attrs = attrs.trim_start();
            if attrs.is_empty() {
                return;
            }
            let eq = attrs.find('=').expect("attribute has a value");
            let name = attrs[..eq].trim();
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':'),
                "bad attribute name {name:?}"
            );
            let value = attrs[eq + 1..].strip_prefix('"').expect("value is quoted");
            let end = value.find('"').expect("value ends");
            check_text(&value[..end]);
            attrs = &value[end + 1..];
        }
    }

    fn check_text(text: &str) {
        assert!(!text.contains('<'), "raw < in {text:?}");
        for (i, _) in text.match_indices('&') {
            let entity = &text[i + 1..];
            let semi = entity.find(';').expect("entity ends");
            assert!(
                ["amp", "lt", "gt", "quot", "apos"].contains(&&entity[..semi]),
                "unknown entity in {text:?}"
            );
        }
    }
}
