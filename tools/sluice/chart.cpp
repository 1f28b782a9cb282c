// SPDX-License-Identifier: Apache-2.0
#include "chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

namespace sluice::cli {

namespace {

constexpr int width = 960, left = 70, right = 30, plot_width = width - left - right;
constexpr int legend_top = 20, legend_row = 16, panel_gap = 44;
constexpr int heights[] = {200, 150, 110};
constexpr const char* colours[] = {"#1d4ed8", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2"};
constexpr const char* request_colour = "#9ca3af";

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Tick values from 0 to at least `max`: 1, 2 or 5 times a power of ten apart, about five of them.
std::vector<double> ticks(double max) {
  if (max <= 0) max = 1;
  const double rough = max / 5;
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= rough) {
      step = m * power;
      break;
    }
  }
  std::vector<double> out;
  for (double v = 0; v <= max * 1.0001 + step; v += step) {
    out.push_back(v);
    if (v >= max) break;
  }
  return out;
}

std::string label(double v, bool percent) {
  char buf[32];
  if (percent) {
    std::snprintf(buf, sizeof buf, "%g%%", v * 100);
  } else {
    std::snprintf(buf, sizeof buf, "%g", v);
  }
  return buf;
}

struct panel {
  int top = 0, height = 0;
  double max = 1;  // the value at the top
  double y(double v) const { return top + height - height * std::clamp(v / max, 0.0, 1.0); }
};

}  // namespace

std::string render_svg(const std::vector<simulation>& runs, const chart_options& options) {
  // The steps shown, and the time axis they span.
  const std::int64_t step_ns = [&] {
    for (const simulation& s : runs) {
      if (s.steps.size() > 1) return s.steps[1].start_ns - s.steps[0].start_ns;
    }
    return std::int64_t{1'000'000'000};
  }();
  std::int64_t end_ns = 0;
  for (const simulation& s : runs) {
    if (!s.steps.empty()) end_ns = std::max(end_ns, s.steps.back().start_ns + step_ns);
  }
  const std::int64_t from = std::clamp<std::int64_t>(options.from_ns, 0, end_ns);
  const std::int64_t to = std::clamp<std::int64_t>(options.to_ns, from + 1, std::max(end_ns, from + 1));
  auto shown = [&](const step_row& r) { return r.start_ns >= from && r.start_ns < to; };
  auto x = [&](std::int64_t t) { return left + plot_width * static_cast<double>(t - from) / static_cast<double>(to - from); };

  // Each panel's scale.
  double trailing = 1, per_step = 1;
  for (const simulation& s : runs) {
    trailing = std::max(trailing, static_cast<double>(s.window_limit));
    for (const step_row& r : s.steps) {
      if (!shown(r)) continue;
      trailing = std::max(trailing, static_cast<double>(r.in_window));
      per_step = std::max(per_step, static_cast<double>(r.requests));
    }
  }
  std::vector<panel> panels;
  const int legend_rows = static_cast<int>((runs.size() + 1) / 2);
  int top = legend_top + legend_rows * legend_row + 30;
  for (int h : heights) {
    panels.push_back({top, h, 1});
    top += h + panel_gap;
  }
  panels[0].max = ticks(trailing).back();
  panels[1].max = ticks(per_step).back();
  panels[2].max = 1;  // a share of the capacity
  const int height = top;

  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
                    std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " +
                    std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n" +
                    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";

  // The legend: each policy in its colour, with its totals; requests; what dashes mean.
  int lx = left;
  auto legend = [&](const std::string& colour, const std::string& text, bool dashed, int row) {
    const int ly = legend_top + row * legend_row;
    out += "<g class=\"legend\"><line x1=\"" + std::to_string(lx) + "\" y1=\"" + std::to_string(ly - 4) + "\" x2=\"" +
           std::to_string(lx + 18) + "\" y2=\"" + std::to_string(ly - 4) + "\" stroke=\"" + colour +
           "\" stroke-width=\"3\"" + (dashed ? " stroke-dasharray=\"6 3\"" : "") + "/><text x=\"" +
           std::to_string(lx + 24) + "\" y=\"" + std::to_string(ly) + "\">" + escape(text) + "</text></g>\n";
  };
  for (std::size_t p = 0; p < runs.size(); ++p) {
    const simulation& s = runs[p];
    lx = left + static_cast<int>(p % 2) * (plot_width / 2);
    legend(colours[p % std::size(colours)],
           s.name + ": admitted " + std::to_string(s.admitted) + " of " + std::to_string(s.requests),
           false, static_cast<int>(p / 2));
  }

  const char* titles[] = {"admitted in the trailing window, against each policy's limit (dashed)",
                          "requests (grey) and admitted, per step", "budget left, share of capacity"};
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const panel& pn = panels[i];
    const bool percent = i == 2;
    out += "<text x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(pn.top - 8) +
           "\" font-weight=\"bold\">" + titles[i] + "</text>\n";
    // y ticks and gridlines.
    for (double v : ticks(percent ? 1.0 : pn.max)) {
      if (v > pn.max * 1.0001) break;
      const std::string y = num(pn.y(v));
      out += "<line class=\"grid\" x1=\"" + std::to_string(left) + "\" y1=\"" + y + "\" x2=\"" +
             std::to_string(left + plot_width) + "\" y2=\"" + y + "\" stroke=\"#e5e7eb\"/>\n";
      out += "<text class=\"tick-y\" data-panel=\"" + std::to_string(i) + "\" x=\"" + std::to_string(left - 6) +
             "\" y=\"" + num(pn.y(v) + 4) + "\" text-anchor=\"end\">" + label(v, percent) + "</text>\n";
    }
    // x ticks and gridlines, in seconds.
    for (double v : ticks(static_cast<double>(to - from) / 1e9)) {
      const std::int64_t t = from + static_cast<std::int64_t>(std::llround(v * 1e9));
      if (t > to) break;
      const std::string xs = num(x(t));
      out += "<line class=\"grid\" x1=\"" + xs + "\" y1=\"" + std::to_string(pn.top) + "\" x2=\"" + xs + "\" y2=\"" +
             std::to_string(pn.top + pn.height) + "\" stroke=\"#e5e7eb\"/>\n";
      out += "<text class=\"tick-x\" data-panel=\"" + std::to_string(i) + "\" x=\"" + xs + "\" y=\"" +
             std::to_string(pn.top + pn.height + 14) + "\" text-anchor=\"middle\">" +
             label(static_cast<double>(t) / 1e9, false) + " s</text>\n";
    }
    out += "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(pn.top) + "\" width=\"" +
           std::to_string(plot_width) + "\" height=\"" + std::to_string(pn.height) +
           "\" fill=\"none\" stroke=\"#6b7280\"/>\n";
  }

  // A series as steps: each value holds from its step's start to the next.
  auto steps = [&](const simulation& s, const panel& pn, const std::string& series, std::size_t policy,
                   const char* colour, const std::function<double(const step_row&)>& value) {
    std::string d;
    for (const step_row& r : s.steps) {
      if (!shown(r)) continue;
      const std::string y = num(pn.y(value(r)));
      d += d.empty() ? "M" + num(x(r.start_ns)) + "," + y : " V" + y;
      d += " H" + num(x(std::min(r.start_ns + step_ns, to)));
    }
    if (d.empty()) return;
    out += "<path class=\"series\" data-series=\"" + series + "\" data-policy=\"" + std::to_string(policy) +
           "\" fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"2\" d=\"" + d + "\"/>\n";
  };
  if (!runs.empty()) {
    steps(runs[0], panels[1], "requests", 0, request_colour, [](const step_row& r) { return double(r.requests); });
  }
  for (std::size_t p = 0; p < runs.size(); ++p) {
    const simulation& s = runs[p];
    const char* colour = colours[p % std::size(colours)];
    if (s.window_limit > 0) {
      const std::string y = num(panels[0].y(static_cast<double>(s.window_limit)));
      out += "<line class=\"series\" data-series=\"limit\" data-policy=\"" + std::to_string(p) + "\" x1=\"" +
             std::to_string(left) + "\" y1=\"" + y + "\" x2=\"" + std::to_string(left + plot_width) + "\" y2=\"" + y +
             "\" stroke=\"" + colour + "\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\"/>\n";
    }
    steps(s, panels[0], "in_window", p, colour, [](const step_row& r) { return double(r.in_window); });
    steps(s, panels[1], "admitted", p, colour, [](const step_row& r) { return double(r.admitted); });
    // The budget as a share of the capacity (an observed run: of the most it reported).
    double capacity = static_cast<double>(s.capacity);
    if (capacity <= 0) {
      for (const step_row& r : s.steps) capacity = std::max(capacity, static_cast<double>(r.remaining));
    }
    capacity = std::max(capacity, 1.0);
    steps(s, panels[2], "remaining", p, colour, [&](const step_row& r) { return double(r.remaining) / capacity; });
  }
  out += "</svg>\n";
  return out;
}

}  // namespace sluice::cli
