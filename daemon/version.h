#ifndef TPD_DAEMON_VERSION_H_
#define TPD_DAEMON_VERSION_H_

namespace tpd {

// The release this tree builds; reported by Admin.Status and `tpd --version`.
inline constexpr char kVersion[] = "0.1.0";

}  // namespace tpd

#endif  // TPD_DAEMON_VERSION_H_
