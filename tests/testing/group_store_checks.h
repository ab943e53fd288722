// What every rendezvous store (tcp://, file://, etcd://) must give a group's members through
// Client::GroupStore, checked the same way for each.

#ifndef TPD_TESTS_TESTING_GROUP_STORE_CHECKS_H_
#define TPD_TESTS_TESTING_GROUP_STORE_CHECKS_H_

#include <string>
#include <vector>

#include "client/client.h"

namespace tpd::testing {

// `members` (one client each, on different nodes, every one holding a member of `group`) see
// one store: a key set through one is read through the others, a wait through one is released
// by a set through another, adds through all sum up, namespaces stay apart, and neither the
// daemon's own store nor the group's records show in it.
void ExpectOneGroupStore(const std::vector<Client*>& members, const std::string& group);

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_GROUP_STORE_CHECKS_H_
