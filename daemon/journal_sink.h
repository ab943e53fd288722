// Logging to the systemd journal (docs/operations.md "Logs"): under systemd, when stderr is
// the journal's stream ($JOURNAL_STREAM names it), each line goes to journald as an entry
// with its priority, so `journalctl -u tpd -p warning` works, and with a field for each
// object the line names in its leading tags: "[session s-1f2e] [group g] ..." becomes
// TPD_SESSION=s-1f2e and TPD_GROUP=g, "[peer node1]" TPD_PEER=node1, and a "uid N" in the
// text TPD_UID=N, so `journalctl -u tpd TPD_GROUP=g` follows one group.
//
// Thread safety: the sink is spdlog's base_sink with a mutex: thread-safe.

#ifndef TPD_DAEMON_JOURNAL_SINK_H_
#define TPD_DAEMON_JOURNAL_SINK_H_

#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "spdlog/sinks/base_sink.h"

namespace tpd {

// Whether this process's stderr is the journal stream systemd connected it to.
bool StderrIsJournal();

// The journal fields ("KEY=value") of one line: MESSAGE, PRIORITY (syslog's: warn is 4),
// SYSLOG_IDENTIFIER=tpd, TPD_COMPONENT (the logger), and the fields its tags name.
std::vector<std::string> JournalFields(absl::string_view component, spdlog::level::level_enum level,
                                       absl::string_view message);

class JournalSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}
};

}  // namespace tpd

#endif  // TPD_DAEMON_JOURNAL_SINK_H_
