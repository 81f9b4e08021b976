; Definitions and references for Rust.
(struct_item name: (type_identifier) @name) @definition.struct
(enum_item name: (type_identifier) @name) @definition.enum
(union_item name: (type_identifier) @name) @definition.struct
(trait_item name: (type_identifier) @name) @definition.interface
(type_item name: (type_identifier) @name) @definition.type
(function_item name: (identifier) @name) @definition.function
(function_signature_item name: (identifier) @name) @definition.function
(impl_item type: (type_identifier) @name) @definition.impl
(impl_item type: (generic_type type: (type_identifier) @name)) @definition.impl
(mod_item name: (identifier) @name) @definition.module
(macro_definition name: (identifier) @name) @definition.function
(const_item name: (identifier) @name) @definition.constant
(static_item name: (identifier) @name) @definition.constant
(call_expression function: (identifier) @reference.call)
(call_expression function: (field_expression field: (field_identifier) @reference.call))
(call_expression function: (scoped_identifier name: (identifier) @reference.call))
(macro_invocation macro: (identifier) @reference.call)
(use_declaration argument: (scoped_identifier name: (identifier) @reference.import))
(use_list (identifier) @reference.import)
(type_identifier) @reference.type
