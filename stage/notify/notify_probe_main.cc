// A stand-in for a stage's start-up, used by notify_test: reports progress with STATUS=, then
// blocks "loading" until a line arrives on stdin, and only then sends READY=1. Exits after a
// second line (or EOF) with STOPPING=1.
#include <iostream>
#include <string>

#include "common/flags.h"
#include "stage/notify/notify.h"

int main(int argc, char** argv) {
  ringserve::ParseCommandLineFlags(
      argc, argv,
      "Test stand-in for a stage's start-up (notify_test): STATUS=, READY=1 after a line on stdin, "
      "STOPPING=1 after a second.\nusage: notify_probe");
  if (!ringserve::NotifyStatus("loading weights").ok()) return 2;
  std::string line;
  if (!std::getline(std::cin, line)) return 3;
  if (!ringserve::NotifyReady("ready: " + line).ok()) return 4;
  std::getline(std::cin, line);
  (void)ringserve::NotifyStopping();
  return 0;
}
