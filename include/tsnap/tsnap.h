#pragma once
/// \file
/// The umbrella header: everything tsnap offers. Include single headers to compile faster.

#include "tsnap/apply_report.h"
#include "tsnap/catalog.h"
#include "tsnap/checkpoint.h"
#include "tsnap/dist_group.h"
#include "tsnap/engine_kind.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/model_state.h"
#include "tsnap/optimizer_state.h"
#include "tsnap/periodic_snapshots.h"
#include "tsnap/reader.h"
#include "tsnap/remove.h"
#include "tsnap/rng_state.h"
#include "tsnap/save.h"
#include "tsnap/save_handle.h"
#include "tsnap/save_options.h"
#include "tsnap/schedule.h"
#include "tsnap/snapshotter.h"
#include "tsnap/state_dict.h"
