"""The HTML report's Jinja2 template and inline stylesheet (one self-contained page: no scripts, fonts or fetches).

Rendered with autoescape on, so every string from a results file (messages, names, repro commands)
is text; the Content-Security-Policy also forbids any script and any network load.
"""

CSS = """
:root { --pass:#2e9d4f; --ni:#b9bec5; --ns:#d9dce0; --skip:#e6e8eb; --xfail:#c9b458; --qw:#e8a33d;
        --xpass:#8e5bd6; --fail:#d6453d; --error:#a8261f; --timeout:#6d1712; --crash:#3d0906; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", "Liberation Sans", Helvetica, Arial, sans-serif;
       margin: 0; color: #1d2228; background: #f6f7f9; }
header { background: #1d2a3a; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 20px; }
header nav a { color: #cfe1ff; margin-right: 14px; }
header p.note { color: #cfe1ff; margin: 4px 0 0; }
main { padding: 8px 24px 40px; }
section.platform, section.matrix { background: #fff; border: 1px solid #dde1e6; border-radius: 6px;
       padding: 6px 18px 18px; margin: 16px 0; }
h2 { font-size: 18px; margin: 12px 0 6px; }
h3 { font-size: 15px; margin: 18px 0 6px; border-bottom: 1px solid #e4e7eb; padding-bottom: 3px; }
table { border-collapse: collapse; margin: 4px 0; }
th, td { border: 1px solid #dde1e6; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eef1f4; font-weight: 600; }
td.num, th.num { text-align: right; }
.verdict { display: inline-block; padding: 3px 10px; border-radius: 4px; font-weight: 700; color: #fff; }
.v-good { background: var(--pass); } .v-bad { background: var(--fail); } .v-partial { background: var(--qw); }
.chips span { display: inline-block; margin: 2px 6px 2px 0; padding: 1px 8px; border-radius: 10px; }
div.wide { overflow-x: auto; }
table.heat td { text-align: center; min-width: 30px; padding: 3px 4px; font-variant-numeric: tabular-nums; }
table.matrix td.op { text-align: left; white-space: nowrap; }
/* The heatmap fits a laptop screen: one label column (op, provider beneath, long class names break at
   their dots), short dtype headers; when it is still wider or taller than the window it scrolls inside
   a box no taller than the window, so both scroll bars are on screen, and the header row and the label
   column stay in view while it scrolls. */
div.heatwrap { overflow: auto; max-height: 85vh; max-width: 100%; }
table.heat thead { position: sticky; top: 0; z-index: 2; }
table.heat td.op, table.heat th.op { position: sticky; left: 0; z-index: 1; background: #fff; text-align: left;
       max-width: 16em; }
table.scorecard td { max-width: 30em; }
table.cases td code { overflow-wrap: anywhere; }
table.heat th.op { z-index: 3; background: #eef1f4; }
table.heat .prov { color: #59626c; font-size: 12px; overflow-wrap: anywhere; }
.o-pass { background: var(--pass); color: #fff; } .o-not-implemented { background: var(--ni); }
.o-not-supported { background: var(--ns); } .o-skip { background: var(--skip); }
.o-xfail { background: var(--xfail); } .o-quality-warning { background: var(--qw); }
.o-xpass { background: var(--xpass); color: #fff; } .o-fail { background: var(--fail); color: #fff; }
.o-error { background: var(--error); color: #fff; } .o-timeout { background: var(--timeout); color: #fff; }
.o-crash { background: var(--crash); color: #fff; } .o-absent { background: #fff; color: #8a929b; }
td.empty { background: #fafbfc; }
/* upstream code's failures (origin.upstream: not the code under test's, reported, not gated): hatched, not red */
.o-upstream { background: repeating-linear-gradient(135deg, #f4dedc 0 5px, #fbf3f2 5px 10px); color: #5a1d19;
              outline: 1px dashed #c9837e; outline-offset: -3px; }
table.matrix .note-up { display: block; font-size: 11px; }
td.some-not-judged { box-shadow: inset 4px 0 0 var(--ni); }
td.n, .n { opacity: .85; }
.legend span { display: inline-block; padding: 1px 8px; margin: 2px 4px 2px 0; border-radius: 3px; font-size: 12px; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
pre.msg { white-space: pre-wrap; word-break: break-word; margin: 0; max-width: 900px; }
td.repro code { white-space: pre-wrap; word-break: break-all; }
.note { color: #59626c; font-size: 12px; }
ul.names { columns: 3; margin: 4px 0; }
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>{{ css }}</style>
</head>
<body>
<header>
<h1>{{ title }}</h1>
<nav>{% if views|length > 1 %}<a href="#matrix">compatibility matrix</a>{% endif %}
{% for v in views %}<a href="#p{{ loop.index }}">{{ v.label }}</a>{% endfor %}</nav>
{% if views|length > 1 and columns_differ_in %}<p class="note">each run is named by its
{{ columns_differ_in }}</p>{% endif %}
</header>
<main>
{% macro legend(upstream=False) %}<div class="legend">{% for o in outcomes %}<span class="{{ o.css }}">{{ o.name }}</span>{% endfor %}{% if upstream %}<span class="o-upstream">upstream failure (not the code under test)</span>{% endif %}</div>{% endmacro %}
{% if views|length > 1 %}
<section class="matrix" id="matrix">
<h2>Compatibility matrix</h2>
<p class="note">One row per op, one column per results file{% if columns_differ_in %} (the columns differ in
{{ columns_differ_in }}; what all runs share is in the title){% endif %}. A cell counts the PASS results among those
that judged an implementation; its colour is the worst outcome of the code under test. Failures of upstream code
(<code>origin.upstream</code>: e.g. vLLM's own kernels and classes under a vendor's plugin) are not the vendor's: a
cell whose failures are all upstream is hatched (<span class="o-upstream">upstream failure</span>), not red, and a
cell with both says both counts (<em>2F +1F upstream</em>). <em>native</em>: the platform leaves the op
to the native implementation; <em>-</em>: not in that run.</p>
<div class="legend">{% for o in outcomes %}<span class="{{ o.css }}">{{ o.name }}</span>{% endfor %}<span class="o-upstream">upstream failure (not the code under test)</span></div>
<div class="wide"><table class="matrix">
<tr><th>op</th>{% for c in matrix_columns %}<th>{{ c|wbr }}</th>{% endfor %}</tr>
{% for op, cells in matrix_rows %}<tr><td class="op">{{ op }}</td>{% for c in cells %}<td class="{{ c.css }}" title="{{ c.title }}">{{ c.text }}{% if c.note %}<span class="note-up">{{ c.note }}</span>{% endif %}</td>{% endfor %}</tr>
{% endfor %}<tr><th>ops fully passing</th>{% for t in matrix_totals %}<th class="num">{{ t }}</th>{% endfor %}</tr>
</table></div>
</section>
{% endif %}
{% for v in views %}
<section class="platform" id="p{{ loop.index }}">
<h2>Platform {{ v.label }} <span class="verdict {{ v.verdict_css }}">{{ v.verdict_text }}</span></h2>
<div class="chips">{% for text, css in v.chips %}<span class="{{ css }}">{{ text }}</span>{% endfor %}</div>

<h3>Scorecard</h3>
<p class="note">{{ scorecard_legend }}</p>
<div class="wide"><table class="scorecard">
<tr>{% for h in v.scorecard[0] %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in v.scorecard[1] %}<tr>{% for cell in row %}<td>{{ cell|wbr }}</td>{% endfor %}</tr>
{% endfor %}</table></div>
{% if v.upstream_scorecard %}<h3>Upstream code, graded apart</h3>
<p class="note">{{ v.upstream_heading }}</p>
<div class="wide"><table class="scorecard">
<tr>{% for h in v.upstream_scorecard[0] %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in v.upstream_scorecard[1] %}<tr>{% for cell in row %}<td>{{ cell|wbr }}</td>{% endfor %}</tr>
{% endfor %}</table></div>{% endif %}

<h3>Heatmap: op &times; dtype &times; family</h3>
<p class="note">Colour: the worst outcome in the cell among results that judged an implementation. Number: the
worst error-to-tolerance ratio of the cell's results, the worst element's |out &minus; native| / (atol + rtol&middot;|native|)
with the tolerance the check applied: the number their messages and the err / tol column quote, to 3 digits here (1 is
the edge of the tolerance; a passing result shows at most 1); <em>abs</em>: the plain max abs error where the results
carry no ratio (files written by older versions); <em>n=</em>: the
number of results where no error is measured. A grey left edge: some results of the cell were not supported or not
implemented (not judged). Hover for the counts.</p>
{{ legend(v.upstream_scorecard is not none) }}
{% if v.heatmap %}<div class="heatwrap"><table class="heat">
<thead><tr><th rowspan="2" class="op">op / provider</th>{% for fam, n in v.families %}<th colspan="{{ n }}">{{ fam }}</th>{% endfor %}</tr>
<tr>{% for fam, dt in v.columns %}<th title="{{ dt }}">{{ short_dtype(dt) }}</th>{% endfor %}</tr></thead>
<tbody>{% for label, provider, cells in v.heatmap %}<tr><td class="op">{{ label|wbr }}<br><span class="prov">{{ provider|wbr }}</span></td>{% for c in cells %}{% if c %}<td class="{{ c.css }}" title="{{ c.title }}">{{ c.text }}</td>{% else %}<td class="empty"></td>{% endif %}{% endfor %}</tr>
{% endfor %}</tbody></table></div>{% else %}<p>No implementation of the platform was judged.</p>{% endif %}

{% macro cases(list) %}<table class="cases">
<tr><th>outcome</th><th>case</th><th class="num">err / tol</th><th>message</th><th>repro</th></tr>
{% for c in list %}<tr><td class="{{ c.css }}">{{ c.result.outcome.value }}</td><td><code>{{ c.result.nodeid }}</code></td>
<td class="num">{{ c.ratio_text }}</td><td><pre class="msg">{{ c.result.message }}</pre>{% if c.result.hint %}<p class="note">cause hint: {{ c.result.hint }}</p>{% endif %}</td>
<td class="repro"><code>{{ c.result.repro }}</code></td></tr>
{% endfor %}</table>{% endmacro %}
<h3>Worst cases</h3>
{% if v.worst %}{{ cases(v.worst) }}{% else %}<p>No failing, waived or warned case.</p>{% endif %}
{% if v.upstream_worst %}<h3>Upstream failures (not your code)</h3>
<p class="note">{{ v.upstream_heading }}</p>
{{ cases(v.upstream_worst) }}{% endif %}
{% if v.closest %}<p class="note">Passing cases nearest their tolerance (a passing result shows at most 1):</p>
<table class="cases"><tr><th>case</th><th class="num">err / tol</th><th>repro</th></tr>
{% for c in v.closest %}<tr><td><code>{{ c.result.nodeid }}</code></td><td class="num">{{ c.ratio_text }}</td><td class="repro"><code>{{ c.result.repro }}</code></td></tr>
{% endfor %}</table>{% endif %}

<h3>Coverage</h3>
{% if v.coverage_scope and v.coverage_scope.startswith("INCOMPLETE") %}<p>IR ops implemented so far: <strong>{{ v.coverage.implemented|length }}</strong>;
native fallback so far: <strong>{{ v.coverage.fallback|length }}</strong>.
CustomOp layers replaced so far: <strong>{{ v.coverage.replaced|length }}</strong>; left to the in-tree class so far: <strong>{{ v.coverage.not_replaced|length }}</strong>.</p>
<p class="note">{{ v.coverage_scope }}.</p>
{% else %}<p>IR ops implemented: <strong>{{ v.coverage.implemented|length }}</strong> of {{ v.coverage.implemented|length + v.coverage.fallback|length }};
native fallback: <strong>{{ v.coverage.fallback|length }}</strong>.
CustomOp layers replaced: <strong>{{ v.coverage.replaced|length }}</strong> of {{ v.coverage.replaced|length + v.coverage.not_replaced|length }}.</p>
{% if v.coverage_scope %}<p class="note">{{ v.coverage_scope }}.</p>{% endif %}{% endif %}
{% for title, key in coverage_parts %}{% if v.coverage[key] %}<p class="note">{{ title }}:</p><ul class="names">{% for n in v.coverage[key] %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}{% endfor %}

<h3>Environment</h3>
<table class="env">{% for k, val in v.environment %}<tr><th>{{ k }}</th><td>{{ val }}</td></tr>{% endfor %}</table>
</section>
{% endfor %}
</main>
</body>
</html>
"""
