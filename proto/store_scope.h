// The gRPC metadata that points a tpd.v1.Store request at a group's store instead of the
// daemon's own (see proto/store.proto): the group, and the caller's session, which must hold
// a member of it.

#ifndef TPD_PROTO_STORE_SCOPE_H_
#define TPD_PROTO_STORE_SCOPE_H_

namespace tpd {

inline constexpr char kStoreGroupMetadata[] = "tpd-group";
inline constexpr char kStoreSessionMetadata[] = "tpd-session";

}  // namespace tpd

#endif  // TPD_PROTO_STORE_SCOPE_H_
