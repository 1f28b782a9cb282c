// SPDX-License-Identifier: Apache-2.0
#include "chart.hpp"

#include <algorithm>
#include <cstdio>

namespace sluice::cli {

namespace {

constexpr int width = 900, panel_height = 260, margin_left = 60, margin_right = 60, margin_top = 40, plot_height = 170;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// One series as a polyline over the panel's plot area; `max` maps to its top.
std::string series(const simulation& s, std::size_t panel, const char* cls, const char* color, double max,
                   std::int64_t step_row::*field) {
  std::string pts;
  const double n = static_cast<double>(std::max<std::size_t>(s.steps.size(), 1));
  const double top = panel * panel_height + margin_top;
  char buf[64];
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    const double x = margin_left + (width - margin_left - margin_right) * (static_cast<double>(i) + 0.5) / n;
    const double y = top + plot_height - plot_height * static_cast<double>(s.steps[i].*field) / std::max(max, 1.0);
    std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x, y);
    pts += buf;
  }
  return "<polyline class=\"" + std::string(cls) + "\" data-policy=\"" + std::to_string(panel) +
         "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
}

}  // namespace

std::string render_svg(const std::vector<simulation>& runs) {
  const int height = static_cast<int>(runs.size()) * panel_height + 20;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  std::string out = buf;
  for (std::size_t p = 0; p < runs.size(); ++p) {
    const simulation& s = runs[p];
    std::int64_t most = 1, budget = 1;
    for (const step_row& r : s.steps) {
      most = std::max(most, r.requests);
      budget = std::max(budget, r.remaining);
    }
    const int top = static_cast<int>(p) * panel_height + margin_top;
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">", margin_left, top - 14);
    out += buf + escape(s.name) + "</text>\n";
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\">admitted %lld of %lld; most in any window: %lld</text>\n",
                  width - 420, top - 14, static_cast<long long>(s.admitted), static_cast<long long>(s.requests),
                  static_cast<long long>(s.max_admitted_in_window));
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", margin_left,
                  top, width - margin_left - margin_right, plot_height);
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"4\" y=\"%d\">%lld/step</text>\n<text x=\"%d\" y=\"%d\">%lld left</text>\n", top + 10,
                  static_cast<long long>(most), width - margin_right + 4, top + 10, static_cast<long long>(budget));
    out += buf;
    // The time axis: its two ends.
    const double end_s =
        static_cast<double>(s.steps.size()) *
        static_cast<double>(s.steps.size() > 1 ? s.steps[1].start_ns - s.steps[0].start_ns : 1'000'000'000) / 1e9;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%d\" y=\"%d\">0 s</text>\n<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%g s</text>\n",
                  margin_left, top + plot_height + 14, width - margin_right, top + plot_height + 14, end_s);
    out += buf;
    out += series(s, p, "requests", "#888888", static_cast<double>(most), &step_row::requests);
    out += series(s, p, "admitted", "#2a9d3f", static_cast<double>(most), &step_row::admitted);
    out += series(s, p, "refused", "#d62828", static_cast<double>(most), &step_row::refused);
    out += series(s, p, "remaining", "#1d4ed8", static_cast<double>(budget), &step_row::remaining);
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%d\" y=\"%d\"><tspan fill=\"#888888\">requests</tspan>  <tspan fill=\"#2a9d3f\">admitted"
                  "</tspan>  <tspan fill=\"#d62828\">refused</tspan>  <tspan fill=\"#1d4ed8\">remaining</tspan>"
                  "  (per step, over time)</text>\n",
                  margin_left, top + plot_height + 30);
    out += buf;
  }
  out += "</svg>\n";
  return out;
}

}  // namespace sluice::cli
