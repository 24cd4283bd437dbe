// Serves the HTTP API over the scripted FakeEngine, for developing and debugging the HTTP
// front, its node-based client tests and the dashboard without a ring. Test tool.
//   http_fake_serve [port]     prints "listening on <port>" and serves until stdin closes.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/logging.h"
#include "coordinator/http/fake_engine.h"
#include "coordinator/http/http_server.h"

int main(int argc, char** argv) {
  std::vector<std::string> args;
  ringserve::ParseCommandLineFlags(
      argc, argv,
      "Serves the HTTP API over a scripted fake engine (a test tool) until stdin closes.\n"
      "usage: http_fake_serve [PORT]",
      &args);
  ringserve::InitLogging("coordinator");
  ringserve::http::FakeEngine engine({.step = std::chrono::milliseconds(20)});
  ringserve::http::HttpServer server(
      engine,
      [](const nlohmann::ordered_json& messages, bool add_generation_prompt,
         const nlohmann::ordered_json&) -> absl::StatusOr<std::string> {
        std::string prompt;
        for (const auto& m : messages) prompt += m.value("content", std::string()) + "\n";
        if (add_generation_prompt) prompt += "assistant: ";
        return prompt;
      },
      {.port = args.empty() ? 0 : std::atoi(args[0].c_str())});
  if (absl::Status status = server.Start(); !status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  std::cout << "listening on " << server.port() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  server.Stop();
  return 0;
}
