// SPDX-License-Identifier: Apache-2.0
// sluiced: the rate-limit service. Command line, logging set-up, then sluice::server::run.
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <systemd/sd-daemon.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "sluice/server/config.hpp"
#include "server/backend_factory.hpp"
#include "server/log_format.hpp"
#include "server/server.hpp"

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  CLI::App app{"sluiced " SLUICE_VERSION " - rate-limit decisions over HTTP", "sluiced"};
  std::string config_path = "/etc/sluice/sluice.toml";
  std::string listen;
  bool check_only = false;
  app.add_option("-c,--config", config_path, "TOML configuration file (reloaded on SIGHUP and on change)")
      ->capture_default_str();
  app.add_option("-l,--listen", listen, "Listen address host:port, overriding [server] listen");
  app.add_flag("--check-config", check_only, "Validate the configuration, print the result and exit (0 valid, 1 not)");
  app.set_version_flag("--version", std::string("sluiced ") + SLUICE_VERSION);
  CLI11_PARSE(app, argc, argv);

  // One line per event, key=value fields, to stderr (journald adds its own timestamp under systemd);
  // [log] may make them JSON once the config is read.
  auto logger = spdlog::stderr_logger_mt("sluiced");
  spdlog::set_default_logger(logger);
  sluice::server::apply_log_settings({});  // text, info: until the config says otherwise
  spdlog::flush_on(spdlog::level::info);

  if (check_only) {
    auto checked = sluice::server::check_config_file(config_path);
    if (!checked) {
      std::cerr << checked.error().message << '\n';
      return 1;
    }
    std::cout << *checked << '\n';
    return 0;
  }
  sluice::server::server_options options;
  options.config_path = config_path;
  if (!listen.empty()) options.listen = listen;
  // Under systemd (Type=notify) the unit is started once sluiced serves; elsewhere NOTIFY_SOCKET is
  // unset and sd_notify does nothing.
  options.notify = [](std::string_view state) { sd_notify(0, std::string(state).c_str()); };
  return sluice::server::run(options);
}
