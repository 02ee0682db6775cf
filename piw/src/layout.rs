//! Graph layout: a pure function from a workflow graph and a card size to
//! positioned cards and routed orthogonal edges.
//!
//! Layers run top to bottom (a layered, Sugiyama-style drawing):
//! 1. edges that close a cycle (found by a depth-first walk from the start
//!    node, in definition order) are *gutter* routes;
//! 2. every other edge goes down: a node's layer is its longest path from
//!    a source;
//! 3. an edge spanning several layers gets one narrow virtual node per
//!    layer it crosses (bounded in all by [`MAX_VIRTUAL_NODES`]; beyond it,
//!    long edges use the gutter too), so it never passes through a card;
//! 4. nodes are ordered in their layer by barycentre sweeps;
//! 5. x positions minimise the distance to the mean of the neighbours'
//!    positions under the spacing constraints (isotonic regression, exact);
//! 6. every gap between two layers holds as many *tracks* (rows for
//!    horizontal segments) as its overlapping segments need; segments from
//!    one source share a track (a fan-out), as do segments into one target.
//!
//! Invariants (tested below, also on a 1,000-node graph):
//! - cards never overlap, and no route passes through a card;
//! - a chain of single edges is one straight vertical line;
//! - gutter routes run right of every card, one column each;
//! - the result depends only on the input (no clock, no hashing order).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// At most this many virtual nodes are added for long edges.
pub const MAX_VIRTUAL_NODES: usize = 50_000;
/// Columns between two neighbouring cards.
const CARD_GAP: i32 = 4;
/// Columns between a virtual node and its neighbours.
const VIRTUAL_GAP: i32 = 2;
/// Columns left of the leftmost card.
const MARGIN: i32 = 1;
/// Rounds of barycentre ordering.
const ORDER_SWEEPS: usize = 4;
/// Rounds of position refinement.
const POSITION_SWEEPS: usize = 4;

/// One edge of the input graph, by node index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeInput {
    pub from: usize,
    pub to: usize,
    pub label: Option<String>,
}

/// The graph to lay out: node ids (in definition order), edges, and the
/// start node when known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphInput {
    pub nodes: Vec<String>,
    pub edges: Vec<EdgeInput>,
    pub start: Option<usize>,
}

impl GraphInput {
    /// A graph from node ids and `(from, to, label)` edges by id; edges
    /// naming unknown nodes are left out.
    pub fn from_ids<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
        edges: impl IntoIterator<Item = (&'a str, &'a str, Option<&'a str>)>,
        start: Option<&str>,
    ) -> Self {
        let nodes: Vec<String> = nodes.into_iter().map(str::to_owned).collect();
        let index: BTreeMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        let edges = edges
            .into_iter()
            .filter_map(|(from, to, label)| {
                Some(EdgeInput {
                    from: *index.get(from)?,
                    to: *index.get(to)?,
                    label: label.map(str::to_owned),
                })
            })
            .collect();
        let start = start.and_then(|id| index.get(id).copied());
        Self {
            nodes,
            edges,
            start,
        }
    }
}

/// The size of every card, in cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CardSize {
    pub width: i32,
    pub height: i32,
}

/// A placed card: top-left corner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Card {
    pub node: usize,
    pub x: i32,
    pub y: i32,
    pub layer: usize,
}

/// How a route runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// Down through the gaps between layers.
    Forward,
    /// Out below its source, along the gutter right of the graph, and into
    /// its target from above (loops, and long edges past the budget).
    Gutter,
}

/// One routed connection between two nodes (all input edges with the same
/// source and target share it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub from: usize,
    pub to: usize,
    /// The input edges it draws.
    pub edges: Vec<usize>,
    pub kind: RouteKind,
    /// Corner points, first just below the source card, last (the arrow)
    /// just above the target card. Consecutive points share x or y.
    pub points: Vec<(i32, i32)>,
}

/// Text beside an arrow: the labels of every route that ends there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub x: i32,
    pub y: i32,
    pub text: String,
    /// Cells the text may take before the next arrow or the gutter.
    pub max_width: i32,
}

/// The laid-out graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub size: CardSize,
    /// One card per input node, by node index.
    pub cards: Vec<Card>,
    pub routes: Vec<Route>,
    pub labels: Vec<Label>,
    pub width: i32,
    pub height: i32,
    pub layers: usize,
}

impl Layout {
    /// The node whose card covers cell `(x, y)`.
    pub fn card_at(&self, x: i32, y: i32) -> Option<usize> {
        self.cards
            .iter()
            .find(|card| {
                x >= card.x
                    && x < card.x + self.size.width
                    && y >= card.y
                    && y < card.y + self.size.height
            })
            .map(|card| card.node)
    }

    /// The centre cell of a node's card.
    pub fn centre(&self, node: usize) -> Option<(i32, i32)> {
        self.cards
            .get(node)
            .map(|card| (card.x + self.size.width / 2, card.y + self.size.height / 2))
    }

    /// Every cell a route's lines cover, in order (corners once).
    pub fn route_cells(route: &Route) -> Vec<(i32, i32)> {
        let mut cells = Vec::new();
        for pair in route.points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            let (dx, dy) = ((x1 - x0).signum(), (y1 - y0).signum());
            let (mut x, mut y) = (x0, y0);
            if cells.last() != Some(&(x, y)) {
                cells.push((x, y));
            }
            while (x, y) != (x1, y1) {
                x += dx;
                y += dy;
                cells.push((x, y));
            }
        }
        if cells.is_empty()
            && let Some(&point) = route.points.first()
        {
            cells.push(point);
        }
        cells
    }
}

/// A source's fan-out or a target's fan-in: segments of one owner share a
/// track.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    Out(usize),
    In(usize),
}

/// One horizontal segment to place in a gap.
#[derive(Clone, Copy, Debug)]
struct Span {
    owner: Owner,
    left: i32,
    right: i32,
}

/// What a merged connection becomes before it is routed.
enum Plan {
    /// The virtual-node chain from source to target (adjacent layers).
    Chain(Vec<usize>),
    Gutter,
}

/// Lays out `graph` with cards of `size`.
pub fn layout(graph: &GraphInput, size: CardSize) -> Layout {
    let n = graph.nodes.len();
    if n == 0 {
        return Layout {
            size,
            cards: Vec::new(),
            routes: Vec::new(),
            labels: Vec::new(),
            width: 0,
            height: 0,
            layers: 0,
        };
    }

    // Merge edges with the same source and target.
    let mut pair_index: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut pairs: Vec<(usize, usize, Vec<usize>)> = Vec::new();
    for (index, edge) in graph.edges.iter().enumerate() {
        if edge.from >= n || edge.to >= n {
            continue;
        }
        let at = *pair_index.entry((edge.from, edge.to)).or_insert_with(|| {
            pairs.push((edge.from, edge.to, Vec::new()));
            pairs.len() - 1
        });
        pairs[at].2.push(index);
    }
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (p, &(from, _, _)) in pairs.iter().enumerate() {
        out[from].push(p);
    }

    let back = back_edges(n, &pairs, &out, graph.start);
    let layer = longest_path_layers(n, &pairs, &back);
    let layers = layer.iter().copied().max().unwrap_or(0) + 1;

    // Virtual nodes: real nodes first, then one per crossed layer.
    let mut v_layer: Vec<usize> = layer.clone();
    let mut v_width: Vec<i32> = vec![size.width; n];
    let mut plans: Vec<Plan> = Vec::with_capacity(pairs.len());
    let mut budget = MAX_VIRTUAL_NODES;
    for (p, &(from, to, _)) in pairs.iter().enumerate() {
        if back[p] {
            plans.push(Plan::Gutter);
            continue;
        }
        let span = layer[to] - layer[from];
        if span > 1 && span - 1 > budget {
            plans.push(Plan::Gutter);
            continue;
        }
        let mut chain = vec![from];
        for l in layer[from] + 1..layer[to] {
            v_layer.push(l);
            v_width.push(1);
            chain.push(v_layer.len() - 1);
            budget -= 1;
        }
        chain.push(to);
        plans.push(Plan::Chain(chain));
    }
    let vn = v_layer.len();
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); vn];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); vn];
    for plan in &plans {
        if let Plan::Chain(chain) = plan {
            for w in chain.windows(2) {
                succs[w[0]].push(w[1]);
                preds[w[1]].push(w[0]);
            }
        }
    }

    let order = order_layers(layers, &v_layer, &preds, &succs);
    let left = positions(&order, &v_width, &preds, &succs, n);
    let port = |v: usize| left[v] + v_width[v] / 2;

    let graph_right = (0..vn).map(|v| left[v] + v_width[v]).max().unwrap_or(0);
    let gutter_routes: Vec<usize> = plans
        .iter()
        .enumerate()
        .filter(|(_, plan)| matches!(plan, Plan::Gutter))
        .map(|(p, _)| p)
        .collect();
    let gutter_x: BTreeMap<usize, i32> = gutter_routes
        .iter()
        .enumerate()
        .map(|(k, &p)| (p, graph_right + 2 + 2 * k as i32))
        .collect();

    // Horizontal segments per gap (gap g is above layer g; gap `layers` is
    // below the last layer).
    let mut spans: Vec<Vec<Span>> = vec![Vec::new(); layers + 1];
    let mut add_span = |gap: usize, owner: Owner, a: i32, b: i32| {
        if a != b {
            spans[gap].push(Span {
                owner,
                left: a.min(b),
                right: a.max(b),
            });
        }
    };
    for (p, plan) in plans.iter().enumerate() {
        let (from, to, _) = pairs[p];
        match plan {
            Plan::Chain(chain) => {
                for w in chain.windows(2) {
                    add_span(v_layer[w[1]], Owner::Out(w[0]), port(w[0]), port(w[1]));
                }
            }
            Plan::Gutter => {
                let g = gutter_x[&p];
                add_span(layer[from] + 1, Owner::Out(from), port(from), g);
                add_span(layer[to], Owner::In(to), port(to), g);
            }
        }
    }
    let tracks: Vec<(usize, BTreeMap<Owner, usize>)> =
        spans.iter().map(|s| assign_tracks(s)).collect();

    // Rows.
    let mut gap_top = vec![0i32; layers + 1];
    let mut gap_height = vec![0i32; layers + 1];
    let mut layer_top = vec![0i32; layers];
    let mut y = 0i32;
    for g in 0..=layers {
        let t = tracks[g].0 as i32;
        gap_height[g] = if g == 0 || g == layers {
            if t > 0 { t + 1 } else { 0 }
        } else {
            t + 2
        };
        gap_top[g] = y;
        y += gap_height[g];
        if g < layers {
            layer_top[g] = y;
            y += size.height;
        }
    }
    let height = y;
    let track_row = |g: usize, owner: Owner| -> i32 {
        let t = tracks[g].1.get(&owner).copied().unwrap_or(0) as i32;
        if g == 0 {
            gap_top[g] + t
        } else {
            gap_top[g] + 1 + t
        }
    };
    let below = |v: usize| layer_top[v_layer[v]] + if v < n { size.height } else { 0 };
    let above = |v: usize| layer_top[v_layer[v]] - 1;

    // Routes.
    let mut routes = Vec::with_capacity(pairs.len());
    for (p, plan) in plans.iter().enumerate() {
        let (from, to, ref edges) = pairs[p];
        let mut points: Vec<(i32, i32)> = Vec::new();
        let push = |points: &mut Vec<(i32, i32)>, point: (i32, i32)| {
            if points.last() != Some(&point) {
                points.push(point);
            }
        };
        let kind = match plan {
            Plan::Chain(chain) => {
                for w in chain.windows(2) {
                    let (a, b) = (w[0], w[1]);
                    let (xa, xb) = (port(a), port(b));
                    // A virtual node's line continues through its layer.
                    let start_y = if a < n {
                        below(a)
                    } else {
                        layer_top[v_layer[a]]
                    };
                    push(&mut points, (xa, start_y));
                    if xa != xb {
                        let row = track_row(v_layer[b], Owner::Out(a));
                        push(&mut points, (xa, row));
                        push(&mut points, (xb, row));
                    }
                    let end_y = if b < n {
                        above(b)
                    } else {
                        layer_top[v_layer[b]]
                    };
                    push(&mut points, (xb, end_y));
                }
                RouteKind::Forward
            }
            Plan::Gutter => {
                let g = gutter_x[&p];
                let out_row = track_row(layer[from] + 1, Owner::Out(from));
                let in_row = track_row(layer[to], Owner::In(to));
                push(&mut points, (port(from), below(from)));
                push(&mut points, (port(from), out_row));
                push(&mut points, (g, out_row));
                push(&mut points, (g, in_row));
                push(&mut points, (port(to), in_row));
                push(&mut points, (port(to), above(to)));
                RouteKind::Gutter
            }
        };
        simplify(&mut points);
        routes.push(Route {
            from,
            to,
            edges: edges.clone(),
            kind,
            points,
        });
    }

    // Labels beside each arrow, joined per arrow.
    let mut by_arrow: BTreeMap<(i32, i32), Vec<String>> = BTreeMap::new();
    for route in &routes {
        let Some(&arrow) = route.points.last() else {
            continue;
        };
        for &e in &route.edges {
            if let Some(label) = graph.edges[e].label.as_ref().filter(|l| !l.is_empty()) {
                let texts = by_arrow.entry(arrow).or_default();
                if !texts.contains(label) {
                    texts.push(label.clone());
                }
            }
        }
    }
    let arrows_by_row: BTreeMap<i32, Vec<i32>> = routes
        .iter()
        .filter_map(|r| r.points.last().copied())
        .fold(BTreeMap::new(), |mut rows, (x, y)| {
            rows.entry(y).or_insert_with(Vec::new).push(x);
            rows
        });
    let labels = by_arrow
        .into_iter()
        .map(|((x, y), texts)| {
            let next = arrows_by_row
                .get(&y)
                .and_then(|xs| xs.iter().copied().filter(|&other| other > x).min())
                .unwrap_or(graph_right + 1);
            Label {
                x: x + 2,
                y,
                text: texts.join(" · "),
                max_width: (next - x - 3).clamp(0, size.width),
            }
        })
        .collect();

    let cards = (0..n)
        .map(|node| Card {
            node,
            x: left[node],
            y: layer_top[layer[node]],
            layer: layer[node],
        })
        .collect();
    let width = gutter_x
        .values()
        .copied()
        .max()
        .map_or(graph_right, |g| g + 1)
        .max(graph_right)
        + MARGIN;
    Layout {
        size,
        cards,
        routes,
        labels,
        width,
        height,
        layers,
    }
}

/// Removes repeated and collinear middle points.
fn simplify(points: &mut Vec<(i32, i32)>) {
    points.dedup();
    let mut i = 1;
    while i + 1 < points.len() {
        let (a, b, c) = (points[i - 1], points[i], points[i + 1]);
        if (a.0 == b.0 && b.0 == c.0) || (a.1 == b.1 && b.1 == c.1) {
            points.remove(i);
        } else {
            i += 1;
        }
    }
}

/// Marks the merged edges that close a cycle, by a depth-first walk from
/// the start node and then from every unvisited node in order.
fn back_edges(
    n: usize,
    pairs: &[(usize, usize, Vec<usize>)],
    out: &[Vec<usize>],
    start: Option<usize>,
) -> Vec<bool> {
    let mut back = vec![false; pairs.len()];
    let mut state = vec![0u8; n]; // 0 new, 1 on the stack, 2 done
    let roots = start.into_iter().chain(0..n);
    for root in roots {
        if state[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = 1;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&p) = out[node].get(*next) {
                *next += 1;
                let to = pairs[p].1;
                match state[to] {
                    0 => {
                        state[to] = 1;
                        stack.push((to, 0));
                    }
                    1 => back[p] = true,
                    _ => {}
                }
            } else {
                state[node] = 2;
                stack.pop();
            }
        }
    }
    back
}

/// Longest-path layering of the forward edges (Kahn's order, lowest index
/// first, so the result is deterministic).
fn longest_path_layers(
    n: usize,
    pairs: &[(usize, usize, Vec<usize>)],
    back: &[bool],
) -> Vec<usize> {
    let mut indegree = vec![0usize; n];
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (p, &(from, to, _)) in pairs.iter().enumerate() {
        if !back[p] {
            indegree[to] += 1;
            out[from].push(to);
        }
    }
    let mut layer = vec![0usize; n];
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&v| indegree[v] == 0).map(Reverse).collect();
    while let Some(Reverse(v)) = ready.pop() {
        for &to in &out[v] {
            layer[to] = layer[to].max(layer[v] + 1);
            indegree[to] -= 1;
            if indegree[to] == 0 {
                ready.push(Reverse(to));
            }
        }
    }
    layer
}

/// Orders every layer: first by the barycentre of predecessors, then
/// alternating upward and downward sweeps.
fn order_layers(
    layers: usize,
    v_layer: &[usize],
    preds: &[Vec<usize>],
    succs: &[Vec<usize>],
) -> Vec<Vec<usize>> {
    let mut order: Vec<Vec<usize>> = vec![Vec::new(); layers];
    for (v, &l) in v_layer.iter().enumerate() {
        order[l].push(v);
    }
    let mut pos = vec![0f64; v_layer.len()];
    let set_pos = |order: &Vec<Vec<usize>>, pos: &mut Vec<f64>| {
        for layer in order {
            for (i, &v) in layer.iter().enumerate() {
                pos[v] = i as f64;
            }
        }
    };
    set_pos(&order, &mut pos);
    let sweep = |layer: &mut Vec<usize>, pos: &mut Vec<f64>, neighbours: &[Vec<usize>]| {
        let key = |v: usize, pos: &Vec<f64>| -> f64 {
            let ns = &neighbours[v];
            if ns.is_empty() {
                pos[v]
            } else {
                ns.iter().map(|&u| pos[u]).sum::<f64>() / ns.len() as f64
            }
        };
        let mut keyed: Vec<(f64, usize, usize)> = layer
            .iter()
            .enumerate()
            .map(|(i, &v)| (key(v, pos), i, v))
            .collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        *layer = keyed.into_iter().map(|(_, _, v)| v).collect();
        for (i, &v) in layer.iter().enumerate() {
            pos[v] = i as f64;
        }
    };
    for layer in order.iter_mut().skip(1) {
        sweep(layer, &mut pos, preds);
    }
    for round in 0..ORDER_SWEEPS {
        if round % 2 == 0 {
            for l in (0..layers.saturating_sub(1)).rev() {
                sweep(&mut order[l], &mut pos, succs);
            }
        } else {
            for layer in order.iter_mut().skip(1) {
                sweep(layer, &mut pos, preds);
            }
        }
    }
    for layer in order.iter_mut().skip(1) {
        sweep(layer, &mut pos, preds);
    }
    order
}

/// The left column of every virtual node.
fn positions(
    order: &[Vec<usize>],
    width: &[i32],
    preds: &[Vec<usize>],
    succs: &[Vec<usize>],
    real: usize,
) -> Vec<i32> {
    let gap = |a: usize, b: usize| {
        if a < real && b < real {
            CARD_GAP
        } else {
            VIRTUAL_GAP
        }
    };
    // Centre-to-centre spacing between neighbours.
    let sep = |a: usize, b: usize| (width[a] + width[b]) as f64 / 2.0 + gap(a, b) as f64;
    let mut centre = vec![0f64; width.len()];
    for layer in order {
        let mut x = 0f64;
        for (i, &v) in layer.iter().enumerate() {
            if i > 0 {
                x += sep(layer[i - 1], v);
            }
            centre[v] = x;
        }
        let mid = x / 2.0;
        for &v in layer {
            centre[v] -= mid;
        }
    }
    let refine = |layer: &[usize], centre: &mut Vec<f64>, neighbours: &[Vec<usize>]| {
        let targets: Vec<f64> = layer
            .iter()
            .map(|&v| {
                let ns = &neighbours[v];
                if ns.is_empty() {
                    centre[v]
                } else {
                    ns.iter().map(|&u| centre[u]).sum::<f64>() / ns.len() as f64
                }
            })
            .collect();
        let seps: Vec<f64> = (0..layer.len())
            .map(|i| {
                if i == 0 {
                    0.0
                } else {
                    sep(layer[i - 1], layer[i])
                }
            })
            .collect();
        for (&v, x) in layer.iter().zip(isotonic_with_gaps(&targets, &seps)) {
            centre[v] = x;
        }
    };
    let layers = order.len();
    for round in 0..POSITION_SWEEPS {
        if round % 2 == 0 {
            for layer in order.iter().skip(1) {
                refine(layer, &mut centre, preds);
            }
        } else {
            for l in (0..layers.saturating_sub(1)).rev() {
                refine(&order[l], &mut centre, succs);
            }
        }
    }
    // Integer columns: round, then restore the spacing left to right.
    let mut left = vec![0i32; width.len()];
    for layer in order {
        for (i, &v) in layer.iter().enumerate() {
            let mut x = (centre[v] - (width[v] / 2) as f64).round() as i32;
            if i > 0 {
                let u = layer[i - 1];
                x = x.max(left[u] + width[u] + gap(u, v));
            }
            left[v] = x;
        }
    }
    let min = left.iter().copied().min().unwrap_or(0);
    for x in &mut left {
        *x += MARGIN - min;
    }
    left
}

/// The closest positions (least squares) to `targets` with
/// `x[i] >= x[i-1] + seps[i]`: pool-adjacent-violators on
/// `y[i] = x[i] - offset[i]`.
fn isotonic_with_gaps(targets: &[f64], seps: &[f64]) -> Vec<f64> {
    let mut offset = Vec::with_capacity(targets.len());
    let mut acc = 0.0;
    for s in seps {
        acc += s;
        offset.push(acc);
    }
    // Blocks of (sum, count, first index).
    let mut blocks: Vec<(f64, f64, usize)> = Vec::new();
    for (i, (&t, &o)) in targets.iter().zip(&offset).enumerate() {
        blocks.push((t - o, 1.0, i));
        while blocks.len() > 1 {
            let (s1, c1, _) = blocks[blocks.len() - 1];
            let (s0, c0, _) = blocks[blocks.len() - 2];
            if s0 / c0 > s1 / c1 {
                blocks.pop();
                let last = blocks.len() - 1;
                blocks[last].0 += s1;
                blocks[last].1 += c1;
                let _ = c0;
            } else {
                break;
            }
        }
    }
    let mut out = vec![0.0; targets.len()];
    for (b, &(sum, count, first)) in blocks.iter().enumerate() {
        let end = blocks.get(b + 1).map_or(targets.len(), |next| next.2);
        for i in first..end {
            out[i] = sum / count + offset[i];
        }
    }
    out
}

/// Gives every span a track; spans of one owner are merged first, and two
/// spans share a track only with a free column between them. Returns the
/// track count and each owner's track.
fn assign_tracks(spans: &[Span]) -> (usize, BTreeMap<Owner, usize>) {
    let mut merged: BTreeMap<Owner, (i32, i32)> = BTreeMap::new();
    for span in spans {
        let entry = merged.entry(span.owner).or_insert((span.left, span.right));
        entry.0 = entry.0.min(span.left);
        entry.1 = entry.1.max(span.right);
    }
    let mut items: Vec<(i32, i32, Owner)> =
        merged.into_iter().map(|(o, (l, r))| (l, r, o)).collect();
    items.sort();
    let mut ends: Vec<i32> = Vec::new();
    let mut assigned = BTreeMap::new();
    for (l, r, owner) in items {
        let track = match ends.iter().position(|&end| end + 1 < l) {
            Some(t) => t,
            None => {
                ends.push(i32::MIN);
                ends.len() - 1
            }
        };
        ends[track] = r;
        assigned.insert(owner, track);
    }
    (ends.len(), assigned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOX: CardSize = CardSize {
        width: 26,
        height: 5,
    };

    fn graph(nodes: &[&str], edges: &[(&str, &str, Option<&str>)]) -> GraphInput {
        GraphInput::from_ids(
            nodes.iter().copied(),
            edges.iter().copied(),
            nodes.first().copied(),
        )
    }

    /// Cards never overlap and no route cell lies on a card.
    fn assert_clean(layout: &Layout) {
        let w = layout.size.width;
        let h = layout.size.height;
        for (i, a) in layout.cards.iter().enumerate() {
            for b in &layout.cards[i + 1..] {
                let apart = a.x + w <= b.x || b.x + w <= a.x || a.y + h <= b.y || b.y + h <= a.y;
                assert!(apart, "cards {} and {} overlap", a.node, b.node);
            }
        }
        for route in &layout.routes {
            for (x, y) in Layout::route_cells(route) {
                assert!(
                    layout.card_at(x, y).is_none(),
                    "route {}->{} passes through card {:?} at ({x},{y}): {:?}",
                    route.from,
                    route.to,
                    layout.card_at(x, y),
                    route.points
                );
            }
            for pair in route.points.windows(2) {
                assert!(
                    pair[0].0 == pair[1].0 || pair[0].1 == pair[1].1,
                    "diagonal segment {pair:?}"
                );
            }
            assert!(route.points.len() >= 2, "{route:?}");
        }
    }

    #[test]
    fn a_chain_is_one_straight_column() {
        let g = graph(
            &["a", "b", "c", "d"],
            &[("a", "b", None), ("b", "c", None), ("c", "d", None)],
        );
        let l = layout(&g, BOX);
        assert_clean(&l);
        assert!(l.cards.iter().all(|c| c.x == l.cards[0].x));
        assert!(l.cards.windows(2).all(|w| w[0].y < w[1].y));
        for route in &l.routes {
            assert_eq!(route.points.len(), 2, "{route:?}");
            assert_eq!(route.kind, RouteKind::Forward);
            let (from, to) = (l.cards[route.from], l.cards[route.to]);
            assert_eq!(route.points[0], (from.x + 13, from.y + 5));
            assert_eq!(route.points[1], (to.x + 13, to.y - 1));
        }
    }

    #[test]
    fn a_diamond_centres_its_ends_over_the_branches() {
        let g = graph(
            &["a", "b", "c", "d"],
            &[
                ("a", "b", Some("left")),
                ("a", "c", Some("right")),
                ("b", "d", None),
                ("c", "d", None),
            ],
        );
        let l = layout(&g, BOX);
        assert_clean(&l);
        let centre = |i: usize| l.cards[i].x + 13;
        assert_eq!(l.cards[1].y, l.cards[2].y);
        assert_eq!(centre(0), (centre(1) + centre(2)) / 2);
        assert_eq!(centre(3), centre(0));
        let texts: Vec<&str> = l.labels.iter().map(|label| label.text.as_str()).collect();
        assert_eq!(texts, ["left", "right"]);
        for label in &l.labels {
            assert!(label.max_width > 0, "{label:?}");
        }
    }

    #[test]
    fn a_loop_goes_through_the_gutter_right_of_every_card() {
        let g = graph(
            &["start", "work", "check", "done"],
            &[
                ("start", "work", None),
                ("work", "check", None),
                ("check", "work", Some("true")),
                ("check", "done", Some("false")),
            ],
        );
        let l = layout(&g, BOX);
        assert_clean(&l);
        let gutter: Vec<&Route> = l
            .routes
            .iter()
            .filter(|r| r.kind == RouteKind::Gutter)
            .collect();
        assert_eq!(gutter.len(), 1);
        let right = l.cards.iter().map(|c| c.x + 26).max().unwrap();
        let xs: Vec<i32> = gutter[0].points.iter().map(|p| p.0).collect();
        assert!(xs.iter().any(|&x| x > right), "{:?}", gutter[0].points);
        // Leaves below check, enters work from above.
        let (check, work) = (l.cards[2], l.cards[1]);
        assert_eq!(gutter[0].points[0], (check.x + 13, check.y + 5));
        assert_eq!(*gutter[0].points.last().unwrap(), (work.x + 13, work.y - 1));
        assert!(l.labels.iter().any(|label| label.text == "true"));
        assert!(l.labels.iter().any(|label| label.text == "false"));
        assert!(l.width > right);
    }

    #[test]
    fn a_self_loop_and_a_loop_to_the_start_are_routed() {
        let g = graph(
            &["a", "b"],
            &[
                ("a", "b", None),
                ("b", "b", Some("retry")),
                ("b", "a", Some("again")),
            ],
        );
        let l = layout(&g, BOX);
        assert_clean(&l);
        assert_eq!(
            l.routes
                .iter()
                .filter(|r| r.kind == RouteKind::Gutter)
                .count(),
            2
        );
        // The loop into the first layer needs rows above it.
        assert!(l.cards[0].y > 0);
    }

    #[test]
    fn a_long_edge_bends_around_the_cards_it_skips() {
        let g = graph(
            &["a", "b", "c", "d"],
            &[
                ("a", "b", None),
                ("b", "c", None),
                ("c", "d", None),
                ("a", "d", Some("skip")),
            ],
        );
        let l = layout(&g, BOX);
        assert_clean(&l);
        let skip = l.routes.iter().find(|r| r.from == 0 && r.to == 3).unwrap();
        assert_eq!(skip.kind, RouteKind::Forward);
    }

    #[test]
    fn edges_with_the_same_ends_share_one_route_and_join_labels() {
        let g = graph(
            &["a", "b"],
            &[("a", "b", Some("ok")), ("a", "b", Some("retry"))],
        );
        let l = layout(&g, BOX);
        assert_eq!(l.routes.len(), 1);
        assert_eq!(l.routes[0].edges, vec![0, 1]);
        assert_eq!(l.labels[0].text, "ok · retry");
    }

    /// A reproducible pseudo-random graph: a backbone chain, forward
    /// branches, a few loops.
    fn big_graph(n: usize, seed: u64) -> GraphInput {
        let mut state = seed;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let ids: Vec<String> = (0..n).map(|i| format!("stage{}/node{i}", i / 50)).collect();
        let mut edges = Vec::new();
        for i in 1..n {
            let from = i - 1 - (next() as usize % 3).min(i - 1);
            edges.push(EdgeInput {
                from,
                to: i,
                label: None,
            });
            if next() % 5 == 0 && i + 2 < n {
                let to = i + 1 + next() as usize % 2;
                edges.push(EdgeInput {
                    from: i,
                    to,
                    label: Some(format!("case{i}")),
                });
            }
            if next() % 40 == 0 && i > 5 {
                let to = i - 1 - next() as usize % 5;
                edges.push(EdgeInput {
                    from: i,
                    to,
                    label: Some("again".into()),
                });
            }
        }
        GraphInput {
            nodes: ids,
            edges,
            start: Some(0),
        }
    }

    #[test]
    fn random_graphs_stay_clean_and_deterministic() {
        for seed in 1..=12u64 {
            let g = big_graph(40, seed * 7919);
            let l = layout(&g, BOX);
            assert_clean(&l);
            assert_eq!(l, layout(&g, BOX), "seed {seed}");
            let compact = layout(
                &g,
                CardSize {
                    width: 22,
                    height: 3,
                },
            );
            assert_clean(&compact);
        }
    }

    #[test]
    fn a_thousand_node_graph_lays_out_cleanly() {
        let g = big_graph(1000, 42);
        let started = std::time::Instant::now();
        let l = layout(&g, BOX);
        let took = started.elapsed();
        // A figure, not an assertion (no timed tests).
        eprintln!(
            "layout of 1,000 nodes and {} edges: {took:?} ({} layers, {}x{} cells)",
            g.edges.len(),
            l.layers,
            l.width,
            l.height
        );
        assert_eq!(l.cards.len(), 1000);
        assert_eq!(
            l.routes.iter().map(|r| r.edges.len()).sum::<usize>(),
            g.edges.len()
        );
        assert_clean(&l);
    }
}
