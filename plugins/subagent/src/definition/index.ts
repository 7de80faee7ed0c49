export {
  type BoundedProjectFileReaderOptions,
  boundedProjectFileReader,
  definitionFormat,
  type ProjectFile,
  type ProjectFileReader,
  sessionProjectFileReader,
} from "./reader.js";
export {
  AddedNodesSchema,
  DEFINITION_LIMITS,
  NODE_ID_PATTERN,
  type WorkflowDefinition,
  type WorkflowDefinitionInput,
  WorkflowDefinitionSchema,
  type WorkflowNode,
  type WorkflowNodeInput,
  WorkflowNodeSchema,
} from "./schema.js";
export {
  findCycle,
  parseWorkflowDefinition,
  validateAddedNodes,
  validateWorkflowDefinition,
} from "./validate.js";
