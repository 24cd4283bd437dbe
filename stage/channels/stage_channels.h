// One stage's ends of the activation channels to its neighbours: host ends (tcp) or device ends
// (cuda_ipc, nccl); the unused ones are null. The receiving end is null exactly on the first
// stage, the sending end exactly on the last. Built by ConnectStageChannels
// (stage/stage_backend.h), owned by the step executor.
#pragma once

#include <memory>

#include "stage/channels/activation_channel.h"
#include "stage/channels/device_channel.h"

namespace ringserve {

struct StageChannels {
  std::unique_ptr<ActivationReceiver> receiver;
  std::unique_ptr<ActivationSender> sender;
  std::unique_ptr<DeviceActivationReceiver> device_receiver;
  std::unique_ptr<DeviceActivationSender> device_sender;
};

}  // namespace ringserve
